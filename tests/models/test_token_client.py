"""Token client against the fake server's token completions: exact ids, the bridge across turns, forks on drift,
truncation, errors and retries."""

import json

import pytest

import tracegym as tg
from tracegym.core.errors import ModelError
from tracegym.core.graph import Node
from tracegym.core.messages import ImagePart, Message, TextPart, assistant, user
from tracegym.core.token_check import validate_tokens
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest
from tracegym.models.connect import make_client
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import ChatMLRenderer
from tracegym.models.token_client import TokenClient
from tracegym.testing import FakeOpenAIServer, reply, tool_call
from tracegym.train.samples import validate

HELLO = ModelRequest(messages=[user("hello")])


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def adder() -> tg.Taskset:
    return tg.Taskset(id="adder", data=[{"prompt": "1+2?", "answer": 3}], tools=[add])


class Chat(tg.Task):
    async def env_response(self, trace):
        return "more"


class ChatTaskset(tg.Taskset):
    task_class = Chat


def chatter(turns: int = 3) -> tg.Taskset:
    """A multi-turn taskset: the environment answers every reply with `more` until max_turns."""
    return ChatTaskset(id="chat", data=[{"prompt": "talk"}], max_turns=turns)


class FullRenderOnly(ChatMLRenderer):
    """A renderer whose bridge never proves itself safe: every turn is rendered in full."""

    def bridge(self, *args, **kwargs):
        return None


def letter_by_letter(renderer: ChatMLRenderer):
    """Sampled ids that spell the reply one character per token: text a re-render tokenizes differently."""
    def ids(message: Message) -> list[int]:
        text = renderer.decode(renderer.completion_ids(message)[:-1])
        return [*(t for ch in text for t in renderer.encode(ch)), renderer.im_end]
    return ids


def last_turn(trace: tg.Trace) -> Node:
    return [n for n in trace.graph.path() if n.sampled][-1]


def client_for(server: FakeOpenAIServer, renderer, **options) -> TokenClient:
    return TokenClient(Endpoint(base_url=server.base_url, model=server.model, backoff=0.0, **options), renderer)


async def test_the_prompt_is_the_rendered_conversation_as_token_ids(smol):
    with FakeOpenAIServer(["hi there"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            response = await client.complete(HELLO)
    sent = server.requests[0]
    assert sent["prompt"] == smol.render(HELLO.messages) == response.prompt_token_ids
    assert sent["return_token_ids"] is True and sent["logprobs"] == 1


async def test_the_reply_is_parsed_from_the_sampled_ids_with_their_logprobs(smol):
    with FakeOpenAIServer(["hi there"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            response = await client.complete(HELLO)
    assert response.message.text == "hi there" and response.finish_reason == "stop"
    assert response.completion_token_ids == smol.completion_ids(assistant("hi there"))
    assert response.completion_logprobs == [-0.5] * len(response.completion_token_ids)


async def test_tool_calls_are_parsed_from_the_sampled_ids(smol):
    with FakeOpenAIServer([reply(None, tool_call("add", {"a": 1, "b": 2}))], renderer=smol) as server:
        async with client_for(server, smol) as client:
            response = await client.complete(ModelRequest(messages=[user("1+2?")]))
    [call] = response.message.tool_calls
    assert call.name == "add" and call.parsed_arguments() == {"a": 1, "b": 2}
    assert response.finish_reason == "tool_calls"


async def test_a_tool_rollout_extends_the_sampled_tokens_on_one_branch(smol):
    with FakeOpenAIServer([reply(None, tool_call("add", {"a": 1, "b": 2})), "3"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            [trace] = await tg.evaluate(adder(), client)
    first, second = server.requests
    completion = smol.completion_ids(trace.graph.messages()[1])
    assert second["prompt"][: len(first["prompt"]) + len(completion)] == first["prompt"] + completion
    assert len(trace.branches) == 1 and validate_tokens(trace) == []
    assert trace.metrics["tool_calls"] == 1 and trace.last_reply == "3"


async def test_a_multi_turn_rollout_keeps_one_branch_whose_tokens_are_the_last_call(smol):
    with FakeOpenAIServer(["one", "two", "three"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            [trace] = await tg.evaluate(chatter(3), client)
    assert trace.num_turns == 3 and len(trace.branches) == 1
    last = server.requests[-1]["prompt"] + smol.completion_ids(assistant("three"))
    assert trace.graph.tokens() == last and validate_tokens(trace) == []


async def test_drifted_sampled_ids_are_kept_by_the_bridge_without_a_fork(smol):
    with FakeOpenAIServer(["Hello world", "again"], renderer=smol, completion_ids=letter_by_letter(smol)) as server:
        async with client_for(server, smol) as client:
            [trace] = await tg.evaluate(chatter(2), client)
    assert len(trace.branches) == 1
    sampled = trace.graph.nodes[1].token_ids[-12:]
    assert server.requests[1]["prompt"][len(server.requests[0]["prompt"]):][:12] == sampled


async def test_drift_forks_when_the_turn_must_be_rendered_in_full(smol):
    full_only = FullRenderOnly(smol.tokenizer, default_system=smol.default_system)
    with FakeOpenAIServer(["Hello world", "again"], renderer=smol, completion_ids=letter_by_letter(smol)) as server:
        async with client_for(server, full_only) as client:
            [trace] = await tg.evaluate(chatter(2), client)
    assert len(trace.branches) == 2
    node = last_turn(trace)
    assert trace.graph.tokens(node.id) == server.requests[-1]["prompt"] + node.token_ids[-sum(node.mask):]
    assert validate_tokens(trace) == []


async def test_a_full_render_that_extends_the_branch_does_not_fork(smol):
    full_only = FullRenderOnly(smol.tokenizer, default_system=smol.default_system)
    with FakeOpenAIServer(["one", "two"], renderer=smol) as server:
        async with client_for(server, full_only) as client:
            [trace] = await tg.evaluate(chatter(2), client)
    assert len(trace.branches) == 1


async def test_a_truncated_turn_keeps_its_sampled_tokens(smol):
    with FakeOpenAIServer(["a long answer that will not fit"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            [trace] = await tg.evaluate(chatter(2), client, sampling=tg.Sampling(max_tokens=3))
    node = last_turn(trace)
    assert trace.stop_reason == tg.StopReason.TRUNCATED
    assert node.mask[-3:] == [1, 1, 1] and sum(node.mask) == 3


async def test_the_temperature_is_sent_and_recorded_on_the_turn(smol):
    with FakeOpenAIServer(["hi"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            [trace] = await tg.evaluate(chatter(1), client, sampling=tg.Sampling(temperature=0.3))
    assert server.requests[0]["temperature"] == 0.3
    assert last_turn(trace).temperature == 0.3


async def test_context_overflow_raises_context_length_error(smol):
    with FakeOpenAIServer(["hi"], renderer=smol, context_length=5) as server:
        async with client_for(server, smol) as client:
            with pytest.raises(tg.ContextLengthError):
                await client.complete(HELLO)


async def test_server_errors_are_retried(smol):
    with FakeOpenAIServer(["hi"], renderer=smol, fail_first=2) as server:
        async with client_for(server, smol, max_retries=2) as client:
            response = await client.complete(HELLO)
    assert response.message.text == "hi" and len(server.requests) == 3


async def test_a_reply_without_token_ids_is_a_model_error(smol):
    async with TokenClient(Endpoint(base_url="http://unused/v1", model="m"), smol) as client:
        with pytest.raises(tg.ModelError, match="no token ids"):
            client.parse_completion({"choices": [{"text": "hi"}]}, [1])


def test_make_client_builds_the_client_the_endpoint_names(smol):
    from tracegym.models.embedded import embedded_model_dir

    tokens = Endpoint(base_url="http://x/v1", model="m", client="tokens", tokenizer=str(embedded_model_dir()))
    assert isinstance(make_client(tokens), TokenClient)
    assert type(make_client(Endpoint(base_url="http://x/v1", model="m"))) is ChatClient


STOP_AT_END = tg.Sampling(stop=["END"])


async def test_a_stop_string_is_cut_from_the_message_but_kept_in_the_sampled_ids(smol):
    with FakeOpenAIServer(["one END two"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            response = await client.complete(ModelRequest(messages=[user("hi")], sampling=STOP_AT_END))
    assert server.requests[0]["stop"] == ["END"]
    assert response.message.content == "one " and response.finish_reason == "stop"
    assert smol.decode(response.completion_token_ids) == "one END"
    assert len(response.completion_logprobs) == len(response.completion_token_ids)


async def test_the_turn_after_a_stop_string_bridges_on_one_clean_branch(smol):
    with FakeOpenAIServer(["one END two", "three"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            [trace] = await tg.evaluate(chatter(2), client, sampling=STOP_AT_END)
    first = next(n for n in trace.graph.nodes if n.sampled)
    stopped = first.token_ids[len(first.token_ids) - sum(first.mask):]
    assert first.message.content == "one " and smol.decode(stopped) == "one END"
    assert server.requests[1]["prompt"][: len(server.requests[0]["prompt"]) + len(stopped)] == \
        server.requests[0]["prompt"] + stopped
    assert len(trace.branches) == 1 and validate_tokens(trace) == [] and validate(trace) == []


async def test_include_stop_str_in_output_keeps_the_stop_string_in_the_message(smol):
    sampling = tg.Sampling(stop=["END"], extra={"include_stop_str_in_output": True})
    with FakeOpenAIServer(["one END two"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            response = await client.complete(ModelRequest(messages=[user("hi")], sampling=sampling))
    assert response.message.content == "one END"


def completion_body_with(token_ids: list[int], token_logprobs: list) -> dict:
    return {"choices": [{"token_ids": token_ids, "finish_reason": "stop",
                         "logprobs": {"token_logprobs": token_logprobs}}]}


async def test_a_null_logprob_is_a_model_error(smol):
    async with TokenClient(Endpoint(base_url="http://unused/v1", model="m"), smol) as client:
        with pytest.raises(tg.ModelError, match="no logprob for sampled token 1"):
            client.parse_completion(completion_body_with([5, 6], [-0.1, None]), [1])


async def test_fewer_logprobs_than_sampled_tokens_is_a_model_error(smol):
    async with TokenClient(Endpoint(base_url="http://unused/v1", model="m"), smol) as client:
        with pytest.raises(tg.ModelError, match="1 logprobs for 2 sampled tokens"):
            client.parse_completion(completion_body_with([5, 6], [-0.1]), [1])


def compact_tool_json(renderer: ChatMLRenderer):
    """Sampled ids whose tool calls are compact JSON (`{"a":1}`): a re-render of the parsed call differs."""
    def ids(message: Message) -> list[int]:
        if not message.tool_calls:
            return renderer.completion_ids(message)
        blocks = [json.dumps({"name": c.name, "arguments": c.parsed_arguments()}, separators=(",", ":"))
                  for c in message.tool_calls]
        return [*renderer.encode("\n".join(f"<tool_call>\n{b}\n</tool_call>" for b in blocks)), renderer.im_end]
    return ids


ADD_CALL = reply(None, tool_call("add", {"a": 1, "b": 2}))


async def test_compact_tool_call_json_is_kept_verbatim_on_one_branch(smol):
    compact = compact_tool_json(smol)
    with FakeOpenAIServer([ADD_CALL, "3"], renderer=smol, completion_ids=compact) as server:
        async with client_for(server, smol) as client:
            [trace] = await tg.evaluate(adder(), client)
    sampled = compact(ADD_CALL)
    call = trace.graph.messages()[1]
    assert call.tool_calls and sampled != smol.completion_ids(call)  # its re-render would differ
    first, second = server.requests
    assert second["prompt"][: len(first["prompt"]) + len(sampled)] == first["prompt"] + sampled
    assert len(trace.branches) == 1 and validate_tokens(trace) == [] and trace.last_reply == "3"


async def test_compact_tool_call_json_forks_when_the_turn_must_be_rendered_in_full(smol):
    full_only = FullRenderOnly(smol.tokenizer, default_system=smol.default_system)
    with FakeOpenAIServer([ADD_CALL, "3"], renderer=smol, completion_ids=compact_tool_json(smol)) as server:
        async with client_for(server, full_only) as client:
            [trace] = await tg.evaluate(adder(), client)
    node = last_turn(trace)
    assert len(trace.branches) == 2 and validate_tokens(trace) == []
    assert trace.graph.tokens(node.id) == server.requests[-1]["prompt"] + node.token_ids[-sum(node.mask):]


async def test_a_prompt_with_an_image_is_refused_naming_the_message_not_rendered_without_it(smol):
    picture = Message(role="user", content=[TextPart(text="what is this?"),
                                            ImagePart(image_url={"url": "data:image/png;base64,AAAA"})])
    with FakeOpenAIServer(["a cat"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            with pytest.raises(ModelError, match=r"message 1 \(user\) carries an image, and the token client renders"):
                await client.complete(ModelRequest(messages=[user("hi"), picture]))
    assert server.requests == []
