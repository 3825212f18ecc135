"""Slow: the token client on real vLLM with the embedded model: multi-turn wordle and tool-calculator rollouts whose
branches are exactly each call's prompt + completion, with real logprobs, and train as exact samples; the logprobs
are those of the sampled tokens (recomputed with the model in transformers, fp32).

Our vLLM runs with `--logprobs-mode processed_logprobs` (vLLM's default reports raw logprobs, before temperature),
so the reported logprobs are those of the distribution sampled from: the recomputation scales the logits by the
sampling temperature, as the trainer does."""

import math
from collections.abc import Callable
from dataclasses import replace

import pytest

import tracegym as tg
from tracegym.core.token_check import check_turn, validate_tokens
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import load_renderer
from tracegym.models.token_client import TokenClient
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
from tracegym.train.samples import trace_samples, validate

pytestmark = pytest.mark.slow


TOOL_CALL = (r'<tool_call>\n\{"name": "(add|subtract|multiply|divide)", '
             r'"arguments": \{"a": [0-9]{1,3}, "b": [0-9]{1,3}\}\}\n</tool_call>')
ANSWER = r"The result is -?[0-9]{1,5}\."


def call_then_answer(request: ModelRequest) -> dict:
    """vLLM structured outputs that make the 135M model call a tool first (it never does unprompted), then answer;
    the ids are still the model's own samples, with their logprobs."""
    called = any(m.role == "tool" for m in request.messages)
    return {"structured_outputs": {"regex": ANSWER if called else TOOL_CALL}}


class Recording:
    """A model client that remembers every response of the client it wraps (calls are sequential here), and
    optionally adds endpoint fields to each request's sampling."""

    def __init__(self, inner: TokenClient) -> None:
        self.inner = inner
        self.responses: list[ModelResponse] = []
        self.steer: Callable[[ModelRequest], dict] | None = None

    @property
    def name(self) -> str:
        return self.inner.name

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def complete(self, request: ModelRequest) -> ModelResponse:
        if self.steer is not None:
            extra = {**request.sampling.extra, **self.steer(request)}
            request = replace(request, sampling=request.sampling.model_copy(update={"extra": extra}))
        response = await self.inner.complete(request)
        self.responses.append(response)
        return response


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    model_dir = str(embedded_model_dir())
    config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME,
                              log_path=tmp_path_factory.mktemp("vllm") / "vllm.log")
    with VLLMServer(config) as server:
        yield server.base_url


@pytest.fixture(scope="module")
def reference_model():
    """The embedded model in transformers, fp32 on CPU."""
    transformers = pytest.importorskip("transformers")
    import torch

    return transformers.AutoModelForCausalLM.from_pretrained(embedded_model_dir(), dtype=torch.float32).eval()


def recomputed_logprobs(model, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0,
                        shift: int = 0) -> list[float]:
    """Each completion token's logprob under `model` (logits / temperature) given everything before it; with
    `shift`, read at positions moved by that many tokens (a misaligned reading, for contrast)."""
    import torch

    ids = torch.tensor([[*prompt_ids, *completion_ids]])
    with torch.no_grad():
        logits = model(ids).logits[0].float() / temperature
    start = len(prompt_ids) - 1 + shift
    rows = torch.log_softmax(logits[start : start + len(completion_ids)], dim=-1)
    targets = torch.tensor(completion_ids[: len(rows)])[:, None]
    return rows[: len(targets)].gather(-1, targets)[:, 0].tolist()


def mean_abs_difference(a: list[float], b: list[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=False)) / min(len(a), len(b))


@pytest.fixture
async def client(base_url):
    endpoint = Endpoint(base_url=base_url, model=SERVED_MODEL_NAME, api_key_env=None, client="tokens")
    async with TokenClient(endpoint, load_renderer(str(embedded_model_dir()))) as inner:
        yield Recording(inner)


async def run_one(taskset: str, client: Recording) -> tg.Trace:
    [trace] = await tg.evaluate(taskset, client, num_tasks=1, rollouts=1,
                                sampling=tg.Sampling(max_tokens=48, temperature=0.8, seed=1))
    return trace


def assert_exact(trace: tg.Trace, responses: list[ModelResponse]) -> None:
    """Every model call's prompt + completion is its branch's tokens; real logprobs on every sampled token."""
    turns = [n for n in trace.graph.nodes if n.sampled and n.token_ids]
    assert len(turns) == len(responses) >= 1, trace.errors
    for node, response in zip(turns, responses, strict=True):
        assert check_turn(trace.graph, node.id, response.prompt_token_ids, response.completion_token_ids) == []
        sampled = [lp for lp, m in zip(node.logprobs, node.mask, strict=True) if m]
        assert sampled == response.completion_logprobs
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in sampled) and any(lp < 0.0 for lp in sampled)
        assert node.temperature == 0.8
    assert validate_tokens(trace) == [] and validate(trace) == []
    assert len(trace.branches) == 1  # every later prompt extended the sampled tokens through the bridge
    print(f"\n{trace.taskset}: {len(responses)} calls, {len(trace.graph.tokens())} tokens, "
          f"finish {[r.finish_reason for r in responses]}, tool calls {trace.metrics.get('tool_calls')}, "
          f"last reply {trace.last_reply[:60]!r}")
    samples = trace_samples(trace)
    assert len(samples) == len(trace.branches)
    assert sum(s.num_trained for s in samples) == sum(len(r.completion_token_ids) for r in responses)


async def test_a_multi_turn_wordle_rollout_is_token_exact(client):
    trace = await run_one("wordle", client)
    assert len(client.responses) >= 2 and not [e for e in trace.errors if e.kind != tg.ErrorKind.TOOL], trace.errors
    assert_exact(trace, client.responses)


async def test_a_tool_calculator_rollout_is_token_exact(client):
    client.steer = call_then_answer
    trace = await run_one("tool-calculator", client)
    assert trace.metrics["tool_calls"] == 1 and trace.last_reply.startswith("The result is"), trace.messages
    assert_exact(trace, client.responses)
    system_prompt = client.inner.renderer.decode(client.responses[0].prompt_token_ids)
    assert "<tools>" in system_prompt and '"name": "add"' in system_prompt


async def test_the_reported_logprobs_are_the_sampled_tokens_logprobs(client, reference_model):
    """On every turn of a multi-turn rollout the reported logprobs match a recomputation over the turn's exact
    prompt + completion (dtype/kernels differ: a small mean gap), and clearly not a reading shifted by one token."""
    await run_one("wordle", client)
    aligned, shifted, unscaled = [], [], []
    for r in client.responses:
        reported, prompt, completion = r.completion_logprobs, r.prompt_token_ids, r.completion_token_ids
        aligned.append(mean_abs_difference(reported, recomputed_logprobs(reference_model, prompt, completion,
                                                                         temperature=0.8)))
        shifted.append(mean_abs_difference(reported, recomputed_logprobs(reference_model, prompt, completion,
                                                                         temperature=0.8, shift=-1)))
        unscaled.append(mean_abs_difference(reported, recomputed_logprobs(reference_model, prompt, completion)))
    print(f"\nmean |reported - recomputed| per turn: at temperature 0.8 {[f'{d:.3f}' for d in aligned]}, "
          f"shifted by one {[f'{d:.3f}' for d in shifted]}, unscaled {[f'{d:.3f}' for d in unscaled]}")
    assert len(aligned) >= 2 and max(aligned) < 0.15
    assert min(shifted) > 1.0
