"""The interception proxy records a program's calls on its rollout's graph: resent history extends the branch,
rewritten or compacted history forks a new one whose first model node carries its whole prompt; tool calls pass
through; the exact tokens of the model client land on the trace."""

import openai
import pytest

from tracegym.core.messages import system, user
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.envs.proxy import InterceptionProxy, attach
from tracegym.envs.rollout import Rollout, Timeouts
from tracegym.envs.task import Task
from tracegym.testing import ScriptedModel, reply, tool_call
from tracegym.testing.scripted_model import encode, render, render_body


def a_rollout(model, **timeouts) -> Rollout:
    task = Task(TaskData(prompt="hi"))
    trace = Trace(task=task.data, model=model.name)
    return Rollout(task, model, Sampling(temperature=0.5), Timeouts(**timeouts), trace)


def sdk(lease) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=lease.base_url, api_key="ignored-the-path-names-the-rollout", max_retries=0)


def said(text: str) -> dict:
    return {"role": "assistant", "content": text}


async def test_resent_history_extends_one_branch_with_exact_tokens():
    model = ScriptedModel(["first", "second"], tokens=True)
    rollout = a_rollout(model)
    async with InterceptionProxy.shared().lease(rollout) as lease:
        client = sdk(lease)
        history = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        one = await client.chat.completions.create(model="anything", messages=history)
        history += [one.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        two = await client.chat.completions.create(model="anything", messages=history)
        await client.close()
    assert (one.choices[0].message.content, two.choices[0].message.content) == ("first", "second")
    graph = rollout.trace.graph
    assert len(graph.branches()) == 1 and len(graph.nodes) == 5
    assert [n.sampled for n in graph.nodes] == [False, False, True, False, True]
    last = model.requests[-1]
    assert graph.tokens() == encode(render(last.messages)) + encode(render_body(graph.nodes[-1].message))
    assert sum(graph.nodes[-1].mask) == len(encode(render_body(graph.nodes[-1].message)))  # only its delta
    assert rollout.trace.prompt_length == 2 and rollout.trace.usage.completion_tokens > 0
    assert graph.nodes[-1].temperature == 0.5 and len(rollout.trace.spans) == 2  # one model span per call


async def test_rewritten_history_forks_and_never_reuses_stale_tokens():
    model = ScriptedModel(rule=lambda r: f"reply to {r.messages[-1].text}", tokens=True)
    rollout = a_rollout(model)
    async with InterceptionProxy.shared().lease(rollout) as lease:
        client = sdk(lease)
        start = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
        one = await client.chat.completions.create(model="m", messages=start)
        kept = [*start, said(one.choices[0].message.content), {"role": "user", "content": "go on"}]
        await client.chat.completions.create(model="m", messages=kept)
        edited = [*start, said("a shorter summary of what I said"), {"role": "user", "content": "go on"}]
        await client.chat.completions.create(model="m", messages=edited)
        compacted = [{"role": "system", "content": "s"}, {"role": "user", "content": "summary: task, done a bit"}]
        await client.chat.completions.create(model="m", messages=compacted)
        await client.close()
    graph = rollout.trace.graph
    assert len(graph.branches()) == 3
    for leaf, request in zip(graph.leaves(), model.requests[1:], strict=True):
        node = graph.nodes[leaf]
        prompt = encode(render(request.messages))
        assert graph.tokens(leaf) == prompt + encode(render_body(node.message))
    # the edited and the compacted branch share no tokens with the first: their model nodes carry the whole prompt
    for leaf, request in zip(graph.leaves()[1:], model.requests[2:], strict=True):
        assert graph.nodes[leaf].mask.count(0) == len(encode(render(request.messages)))
    assert graph.messages(graph.leaves()[1])[2].text == "a shorter summary of what I said"


async def test_tool_calls_pass_through_and_their_answers_extend_the_branch():
    call = tool_call("add", {"a": 2, "b": 3}, id="call_add")
    model = ScriptedModel([reply(None, call), "5"], tokens=True)
    rollout = a_rollout(model)
    tools = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
    async with InterceptionProxy.shared().lease(rollout) as lease:
        client = sdk(lease)
        history = [{"role": "user", "content": "2+3?"}]
        one = await client.chat.completions.create(model="m", messages=history, tools=tools)
        message = one.choices[0].message
        assert one.choices[0].finish_reason == "tool_calls"
        assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls] == [
            ("call_add", "add", '{"a": 2, "b": 3}')]
        history += [message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": "call_add", "content": "5"}]
        two = await client.chat.completions.create(model="m", messages=history, tools=tools)
        await client.close()
    assert two.choices[0].message.content == "5"
    assert model.requests[0].tools[0].name == "add"  # the program's tools reach the model
    assert len(rollout.trace.graph.branches()) == 1
    assert [m.role for m in rollout.trace.messages] == ["user", "assistant", "tool", "assistant"]


def test_a_conversation_already_answered_is_answered_again_on_a_sibling():
    model = ScriptedModel(["x"])
    rollout = a_rollout(model)
    graph = rollout.trace.graph
    attach(graph, [system("s"), user("u")])
    graph.add_model_turn(reply("x"))
    attach(graph, [system("s"), user("u")])  # the program asked the same again (a retry on its side)
    assert graph.head == 3 and graph.nodes[3].parent == 0 and graph.nodes[3].message == user("u")


@pytest.mark.parametrize("key_in", ["path", "api_key"])
async def test_the_rollout_key_works_in_the_path_or_as_the_api_key(key_in):
    rollout = a_rollout(ScriptedModel(["ok"]))
    async with InterceptionProxy.shared().lease(rollout) as lease:
        if key_in == "path":
            client = openai.AsyncOpenAI(base_url=lease.base_url, api_key="x", max_retries=0)
        else:
            root = lease.base_url.split("/r/")[0]
            client = openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=lease.key, max_retries=0)
        answer = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
        models = await client.models.list()
        await client.close()
    assert answer.choices[0].message.content == "ok" and answer.model == "scripted"
    assert [m.id for m in models.data] == ["scripted"]


def _tool(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} two integers",
                                             "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize("changed", [False, True])
async def test_a_changed_tool_list_is_rendered_in_full_and_forks(changed):
    """The tools are in the prompt's first tokens: a call whose tool list differs from the previous call's must
    not extend the branch's tokens (rendered with the old tools), but render in full and fork."""
    transformers = pytest.importorskip("transformers")
    from tracegym.core.tool_spec import ToolSpec
    from tracegym.models.embedded import embedded_model_dir
    from tracegym.models.endpoint import Endpoint
    from tracegym.models.renderer import renderer_for
    from tracegym.models.token_client import TokenClient
    from tracegym.testing import FakeOpenAIServer

    renderer = renderer_for(transformers.AutoTokenizer.from_pretrained(embedded_model_dir()))
    first, second = [_tool("add")], [_tool("add"), _tool("mul")] if changed else [_tool("add")]
    with FakeOpenAIServer(["one", "two"], renderer=renderer) as server:
        model = TokenClient(Endpoint(base_url=server.base_url, model=server.model, backoff=0.0), renderer)
        rollout = a_rollout(model)
        async with InterceptionProxy.shared().lease(rollout) as lease:
            client = sdk(lease)
            history = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
            one = await client.chat.completions.create(model="m", messages=history, tools=first)
            history += [said(one.choices[0].message.content), {"role": "user", "content": "more"}]
            await client.chat.completions.create(model="m", messages=history, tools=second)
            await client.close()
        await model.aclose()
    graph = rollout.trace.graph
    specs = [ToolSpec(name=t["function"]["name"], description=t["function"]["description"],
                      parameters=t["function"]["parameters"]) for t in second]
    sent = server.requests[-1]["prompt"]
    assert sent == renderer.render(graph.messages()[:-1], specs)  # the new tools are in the prompt's tokens
    assert len(graph.branches()) == (2 if changed else 1)


async def test_a_template_that_is_not_prefix_stable_forks_each_call_and_every_sampled_node_has_tokens():
    """Measured 9 of issue 32: each call's prompt re-renders the earlier replies, so each call forks; the fork's
    copies of earlier replies are not marked sampled (they name their originals), and every node marked sampled
    carries its tokens."""
    model = ScriptedModel(rule=lambda r: f"reply {len(r.messages)}", tokens=True, prefix_stable=False)
    rollout = a_rollout(model)
    async with InterceptionProxy.shared().lease(rollout) as lease:
        client = sdk(lease)
        history = [{"role": "user", "content": "go"}]
        for turn in range(4):
            answer = await client.chat.completions.create(model="m", messages=history)
            history += [said(answer.choices[0].message.content), {"role": "user", "content": f"more {turn}"}]
        await client.close()
    graph = rollout.trace.graph
    assert len(graph.branches()) == 4 and rollout.trace.num_turns == 4
    assert [n.id for n in graph.nodes if n.sampled and not n.token_ids] == []
    assert graph.copied_turns() == 0 + 1 + 2 + 3
    turns = [n for n in graph.nodes if n.sampled]
    for node, request in zip(turns, model.requests, strict=True):  # each turn's branch: exactly its call's tokens
        prompt = encode(render(request.messages, prefix_stable=False))
        assert graph.tokens(node.id) == prompt + encode(render_body(node.message))
