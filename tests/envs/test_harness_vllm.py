"""Slow: the shipped ReAct agent, run by a program harness, against the embedded model on real vLLM through the
proxy and the token client: a tool call, its result, an answer; every call's prompt + completion is its branch's
tokens, with vLLM's logprobs, on one branch (the second prompt extends the first call's sampled tokens)."""

from dataclasses import replace
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.core.token_check import check_turn, validate_tokens
from tracegym.envs.registry import load_taskset
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.renderer import load_renderer
from tracegym.models.token_client import TokenClient
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig

pytestmark = pytest.mark.slow
pytest.importorskip("openai")
EXAMPLE = Path(__file__).parents[2] / "examples" / "agents" / "react_arithmetic.py"
TOOL_CALL = (r'<tool_call>\n\{"name": "calculate", "arguments": \{"expression": "[0-9]{1,2} [+*-] [0-9]{1,2}"\}\}'
             r'\n</tool_call>')
ANSWER = r"The answer is -?[0-9]{1,5}\."


class Steered:
    """The token client, with vLLM's structured outputs making the 135M model call `calculate` first and then
    answer (it never calls a tool unprompted); the ids are still its own samples. Remembers every response."""

    def __init__(self, inner: TokenClient) -> None:
        self.inner, self.responses = inner, []

    @property
    def name(self) -> str:
        return self.inner.name

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        called = any(m.role == "tool" for m in request.messages)
        extra = {**request.sampling.extra, "structured_outputs": {"regex": ANSWER if called else TOOL_CALL}}
        response = await self.inner.complete(replace(request, sampling=request.sampling.model_copy(
            update={"extra": extra})))
        self.responses.append(response)
        return response


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    config = VLLMServerConfig(model=str(embedded_model_dir()), served_model_name=SERVED_MODEL_NAME,
                              log_path=tmp_path_factory.mktemp("vllm") / "vllm.log")
    with VLLMServer(config) as server:
        yield server.base_url


async def test_the_react_agent_on_the_embedded_model_is_token_exact(base_url):
    endpoint = tg.Endpoint(base_url=base_url, model=SERVED_MODEL_NAME, api_key_env=None, client="tokens")
    async with TokenClient(endpoint, load_renderer(str(embedded_model_dir()))) as inner:
        model = Steered(inner)
        [trace] = await tg.evaluate(load_taskset(f"{EXAMPLE}:ReactArithmetic"), model, num_tasks=1,
                                    sampling=tg.Sampling(max_tokens=48, temperature=0.8, seed=3))
    assert not trace.errors and trace.stop_reason == tg.StopReason.COMPLETED, trace.errors
    assert trace.metrics["used_calculator"] == 1.0 and trace.rewards["exact"].score is not None
    assert [m.role for m in trace.messages][-3:] == ["assistant", "tool", "assistant"]
    assert trace.last_reply.startswith("The answer is")
    turns = [n for n in trace.graph.nodes if n.sampled]
    assert len(turns) == len(model.responses) == 2 and len(trace.branches) == 1
    for node, response in zip(turns, model.responses, strict=True):
        assert check_turn(trace.graph, node.id, response.prompt_token_ids, response.completion_token_ids) == []
        assert [lp for lp, m in zip(node.logprobs, node.mask, strict=True) if m] == response.completion_logprobs
    assert validate_tokens(trace) == []
