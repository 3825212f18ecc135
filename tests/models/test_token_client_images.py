"""Exact tokens with images: the token client on the embedded VLM's processor (no vLLM; the fake server's generate
endpoint answers), checked against the processor's own render of the same chat."""

import base64
import io
import json

import pytest
from aiohttp import web

import tracegym as tg
from tracegym.core.errors import ModelError
from tracegym.core.messages import ImagePart, Message, TextPart, user
from tracegym.core.token_check import validate_tokens
from tracegym.models.client import ModelRequest
from tracegym.models.endpoint import Endpoint
from tracegym.models.image_prompt import image_bytes, image_hash
from tracegym.models.renderer import ChatMLRenderer, load_renderer
from tracegym.models.token_client import TokenClient, server_root
from tracegym.testing import FakeOpenAIServer, reply, tool_call

PIL = pytest.importorskip("PIL.Image")


def png(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> ImagePart:
    """A one-colour PNG as a data: URI image part."""
    buffer = io.BytesIO()
    PIL.new("RGB", size, colour).save(buffer, format="PNG")
    return ImagePart(image_url={"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()})


RED, BLUE = png((255, 0, 0)), png((0, 0, 255), (64, 64))


def pictures() -> tg.Taskset:
    async def board() -> list[TextPart | ImagePart]:
        """Show the board."""
        return [TextPart(text="here is the board:"), BLUE]

    prompt = [{"role": "user", "content": [RED.model_dump(), {"type": "text", "text": "What colour is it?"}]}]
    return tg.Taskset(id="pictures", data=[{"prompt": prompt}], tools=[board])


@pytest.fixture(scope="session")
def vlm_dir(tmp_path_factory):
    """A folder with the embedded VLM's processor and config (the weights are not needed to render)."""
    pytest.importorskip("transformers")
    from tracegym.models.embedded import embedded_model_dir
    from tracegym.models.embedded_vlm import save_processor, vlm_config

    folder = tmp_path_factory.mktemp("vlm")
    vlm_config(embedded_model_dir(), save_processor(embedded_model_dir(), folder)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def vlm(vlm_dir) -> ChatMLRenderer:
    renderer = load_renderer(str(vlm_dir))
    assert isinstance(renderer, ChatMLRenderer) and renderer.images is not None
    return renderer


@pytest.fixture(scope="session")
def processor(vlm_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(vlm_dir)


def chat_text(processor, trace: tg.Trace, messages: list[Message]) -> str:
    """The processor's chat template on `messages` (with the trace's tools), ready for the model's next turn."""
    return processor.apply_chat_template([m.to_openai() for m in messages], tools=[t.to_openai() for t in trace.tools],
                                         add_generation_prompt=True, tokenize=False)


def processed(processor, trace: tg.Trace, messages: list[Message]) -> list[int]:
    """The processor's own ids for the chat: its template's text, then text and images through the processor."""
    text = chat_text(processor, trace, messages)
    images = [PIL.open(io.BytesIO(image_bytes(p))) for m in messages if isinstance(m.content, list)
              for p in m.content if isinstance(p, ImagePart)]
    return [int(t) for t in processor(text=text, images=images)["input_ids"][0]]


def client_for(server: FakeOpenAIServer, renderer) -> TokenClient:
    return TokenClient(Endpoint(base_url=server.base_url, model=server.model, backoff=0.0), renderer)


_rollouts: dict[int, tuple[tg.Trace, FakeOpenAIServer]] = {}


async def image_rollout(vlm) -> tuple[tg.Trace, FakeOpenAIServer]:
    """The rollout the tests read (run once per renderer): the model calls the tool, then answers."""
    if id(vlm) not in _rollouts:
        script = [reply(None, tool_call("board", {})), "It is red, and the board is blue."]
        with FakeOpenAIServer(script, renderer=vlm) as server:
            async with client_for(server, vlm) as client:
                [trace] = await tg.evaluate(pictures(), client)
        _rollouts[id(vlm)] = trace, server
    return _rollouts[id(vlm)]


async def test_a_multi_turn_image_trace_is_token_for_token_the_processors_render(vlm, processor):
    trace, _ = await image_rollout(vlm)
    assert trace.ok and len(trace.branches) == 1 and validate_tokens(trace) == []
    last = trace.graph.nodes[-1]
    prompt = trace.graph.tokens()[:-sum(last.mask)]
    assert prompt == processed(processor, trace, trace.messages[:-1])


async def test_the_trace_tokens_decode_to_the_conversation(vlm, processor):
    trace, _ = await image_rollout(vlm)
    text = chat_text(processor, trace, trace.messages[:-1]) + "It is red, and the board is blue.<|im_end|>"
    expanded = text.replace("<image>", vlm.decode(vlm.images.run(image_bytes(RED))))
    assert vlm.decode(trace.graph.tokens()) == expanded


async def test_each_model_turn_records_its_new_images_runs_and_hashes(vlm):
    trace, _ = await image_rollout(vlm)
    first, second = [n for n in trace.graph.nodes if n.sampled]
    assert [s.sha256 for s in first.images] == [image_hash(image_bytes(RED))]
    assert [s.sha256 for s in second.images] == [image_hash(image_bytes(BLUE))]
    tokens = trace.graph.tokens()
    for span in trace.graph.image_spans():
        run = tokens[span.offset:span.offset + span.length]
        assert run == vlm.images.run(image_bytes(RED)) and run.count(vlm.images.image_token_id) == 49


async def test_the_placeholder_run_is_the_processors(vlm, processor):
    trace, _ = await image_rollout(vlm)
    ids = processed(processor, trace, trace.messages[:-1])
    image_id = vlm.images.image_token_id
    for span in trace.graph.image_spans():
        assert ids[span.offset - 1] != image_id and ids[span.offset + span.length] != image_id
        assert ids[span.offset:span.offset + span.length] == trace.graph.tokens()[span.offset:span.offset + span.length]


async def test_the_images_go_to_the_generate_endpoint_with_the_prompt_ids(vlm):
    _, server = await image_rollout(vlm)
    first, second = server.requests
    assert [p["url"] for p in first["content_parts"]] == [RED.image_url["url"]]
    assert [p["url"] for p in second["content_parts"]] == [RED.image_url["url"], BLUE.image_url["url"]]
    assert second["token_ids"][:len(first["token_ids"])] == first["token_ids"]
    assert first["sampling_params"]["logprobs"] == 1 and "prompt" not in first["sampling_params"]


class Reexpanding(FakeOpenAIServer):
    """A server whose processor expanded the images into other ids than ours (here: one token fewer)."""

    async def _generate(self, http):
        answer = await super()._generate(http)
        body = json.loads(answer.body)
        body["prompt_token_ids"] = body["prompt_token_ids"][1:]
        return web.json_response(body)


async def test_a_prompt_vllm_expanded_otherwise_is_a_model_error(vlm):
    with Reexpanding(["red"], renderer=vlm) as server:
        async with client_for(server, vlm) as client:
            with pytest.raises(ModelError, match="its processor and ours disagree"):
                await client.complete(ModelRequest(messages=[user([RED, TextPart(text="colour?")])]))


async def test_text_in_a_message_spelling_the_image_token_is_a_model_error(vlm):
    request = ModelRequest(messages=[user([RED, TextPart(text="what is <image>?")])])
    with pytest.raises(ModelError, match=r"2 <image> tokens for 1 images"):
        vlm.render(request.messages)


async def test_a_text_only_model_still_refuses_images_naming_the_message(smol):
    with FakeOpenAIServer(["red"], renderer=smol) as server:
        async with client_for(server, smol) as client:
            with pytest.raises(ModelError, match=r"message 0 \(user\) carries an image"):
                await client.complete(ModelRequest(messages=[user([RED])]))
    assert server.requests == []


def test_an_image_that_is_not_a_data_uri_is_a_model_error_naming_it(vlm):
    remote = ImagePart(image_url={"url": "https://example.com/cat.png"})
    with pytest.raises(ModelError, match="not a data: URI"):
        vlm.render([user([remote])])


def test_the_generate_endpoint_is_at_the_servers_root():
    assert server_root("http://host:8000/v1") == "http://host:8000"
    assert server_root("http://host:8000/v1/") == "http://host:8000"


def test_an_image_in_the_system_message_is_rendered_not_dropped(vlm):
    ids = vlm.render([Message(role="system", content=[TextPart(text="look:"), RED]), user("colour?")])
    assert ids.count(vlm.images.image_token_id) == 49
