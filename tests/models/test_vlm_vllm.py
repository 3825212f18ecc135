"""Slow: the embedded VLM on real vLLM (one server start): a chat completion with an image, and a token-client
rollout with an image in the prompt and one in a tool result whose prompts vLLM expanded exactly as we did."""

import base64
import io
import json

import pytest

import tracegym as tg
from tracegym.core.messages import ImagePart, TextPart
from tracegym.core.token_check import validate_tokens
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.embedded_vlm import IMAGE_SEQ_LEN, vlm_choice
from tracegym.models.endpoint import Endpoint
from tracegym.models.image_prompt import image_bytes, image_hash
from tracegym.models.launch import server_config
from tracegym.models.model_choice import ModelChoice
from tracegym.models.renderer import load_renderer
from tracegym.models.token_client import TokenClient
from tracegym.models.transport import call
from tracegym.models.vllm_server import VLLMServer

pytestmark = pytest.mark.slow

PIL = pytest.importorskip("PIL.Image")


def png(colour: tuple[int, int, int], size: tuple[int, int]) -> ImagePart:
    buffer = io.BytesIO()
    PIL.new("RGB", size, colour).save(buffer, format="PNG")
    return ImagePart(image_url={"url": "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()})


RED, BLUE = png((255, 0, 0), (40, 30)), png((0, 0, 255), (300, 200))
TOOL_CALL = r'<tool_call>\n\{"name": "board", "arguments": \{\}\}\n</tool_call>'


def pictures() -> tg.Taskset:
    async def board() -> list[TextPart | ImagePart]:
        """Show the board."""
        return [TextPart(text="here is the board:"), BLUE]

    prompt = [{"role": "user", "content": [RED.model_dump(), {"type": "text", "text": "What colour is it?"}]}]
    return tg.Taskset(id="pictures", data=[{"prompt": prompt}], tools=[board])


class CallsFirst:
    """The token client, steered by vLLM's structured outputs to call the tool on its first turn (the 135M model
    never does unprompted); the ids are still the model's samples."""

    def __init__(self, inner: TokenClient) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if not any(m.role == "tool" for m in request.messages):
            extra = {**request.sampling.extra, "structured_outputs": {"regex": TOOL_CALL}}
            sampling = request.sampling.model_copy(update={"extra": extra})
            request = ModelRequest(request.messages, request.tools, sampling, request.prefix, request.session)
        return await self.inner.complete(request)


@pytest.fixture(scope="module")
def vlm_server():
    config = server_config(vlm_choice(ModelChoice())).model_copy(update={"startup_timeout_s": 900})
    with VLLMServer(config) as server:
        yield server, config


def test_vllm_answers_a_chat_message_with_an_image(vlm_server):
    server, config = vlm_server
    body = {"model": config.name, "max_tokens": 8, "temperature": 0.0,
            "messages": [{"role": "user", "content": [RED.model_dump(), {"type": "text", "text": "What colour?"}]}]}
    answer = json.loads(call(f"{server.base_url}/chat/completions", body, timeout=300))
    assert answer["choices"][0]["message"]["content"]
    assert answer["usage"]["prompt_tokens"] > IMAGE_SEQ_LEN


async def test_a_token_client_rollout_with_images_is_exact_on_vllm(vlm_server):
    server, config = vlm_server
    renderer = load_renderer(config.model)
    async with TokenClient(Endpoint(base_url=server.base_url, model=config.name, timeout=300), renderer) as client:
        sampling = tg.Sampling(max_tokens=32, temperature=0.0)
        [trace] = await tg.evaluate(pictures(), CallsFirst(client), sampling=sampling)
    assert not trace.errors and trace.metrics["tool_calls"] == 1 and validate_tokens(trace) == []
    spans = trace.graph.image_spans()
    assert [s.sha256 for s in spans] == [image_hash(image_bytes(RED)), image_hash(image_bytes(BLUE))]
    tokens = trace.graph.tokens()
    assert all(tokens[s.offset:s.offset + s.length].count(renderer.images.image_token_id) == IMAGE_SEQ_LEN
               for s in spans)


def test_the_vlm_text_tower_is_the_embedded_models_weights(vlm_server):
    from safetensors import safe_open

    from tracegym.models.embedded import embedded_model_dir

    _, config = vlm_server
    with safe_open(f"{config.model}/model.safetensors", "pt") as vlm, \
            safe_open(f"{embedded_model_dir()}/model.safetensors", "pt") as text:
        names = [n for n in text.keys() if n != "lm_head.weight"]  # noqa: SIM118 (safe_open has no iteration)
        for name in names:
            ours, theirs = vlm.get_tensor(name.replace("model.", "model.text_model.", 1)), text.get_tensor(name)
            assert (ours[: len(theirs)] == theirs).all(), name
