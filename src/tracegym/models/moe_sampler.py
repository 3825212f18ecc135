"""MoE sampler: a model client that samples on a transformers MoE model and returns the experts each token went to.

vLLM 0.32 returns routed experts only from its V2 model runner, which needs Triton, and the CPU build has no
Triton backend (`benchmarks/moe_replay.md`): on CPU this client is the sampler whose routing the trainer replays.
It returns routing as vLLM does: one `[layer][k]` row per forwarded token (the prompt's and the completion's but
its last), so `MessageGraph.add_model_turn` places either the same way.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import torch

from tracegym.core.errors import ModelError
from tracegym.core.graph import RoutedExperts
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.models.expert_routing import recorded_routing, stacked
from tracegym.models.renderer import Renderer
from tracegym.models.token_client import next_prompt_ids


class MoeSamplerClient:
    """Samples one completion per request on `model` (its dtype is the sampler's numerics), token by token with a
    KV cache, recording the routers' choices."""

    def __init__(self, model: Any, renderer: Renderer, name: str = "moe-sampler", seed: int = 0) -> None:
        self.model = model.eval()
        self.renderer = renderer
        self._name = name
        self.generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()  # one forward at a time: the routers' hooks are the model's

    @property
    def name(self) -> str:
        return self._name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        sampling = request.sampling
        unsupported = [n for n, off in (("top_p", sampling.top_p == 1.0), ("stop", not sampling.stop)) if not off]
        if unsupported or sampling.temperature <= 0 or sampling.max_tokens is None:
            raise ModelError(f"the MoE sampler samples at a temperature > 0 with max_tokens set, and has no "
                             f"{', '.join(unsupported) or 'greedy mode'}")
        prompt_ids = next_prompt_ids(self.renderer, request)
        ids, logprobs, routing = await asyncio.to_thread(self._sample, prompt_ids, sampling.temperature,
                                                         sampling.max_tokens)
        finish = "stop" if ids[-1] in self.renderer.stop_token_ids else "length"
        return ModelResponse(message=self.renderer.parse(ids), finish_reason=finish, prompt_tokens=len(prompt_ids),
                             completion_tokens=len(ids), prompt_token_ids=prompt_ids, completion_token_ids=ids,
                             completion_logprobs=logprobs, routed_experts=routing)

    def _sample(self, prompt_ids: list[int], temperature: float, max_tokens: int,
                ) -> tuple[list[int], list[float], RoutedExperts]:
        with self._lock:
            return sample_routed(self.model, prompt_ids, temperature, max_tokens, self.renderer.stop_token_ids,
                                 self.generator)

    async def aclose(self) -> None:
        return None


@torch.no_grad()
def sample_routed(model: Any, prompt_ids: list[int], temperature: float, max_tokens: int, stop_ids: list[int],
                  generator: torch.Generator) -> tuple[list[int], list[float], RoutedExperts]:
    """Sample up to `max_tokens` tokens after `prompt_ids`: their ids, their logprobs at `temperature`, and the
    experts of every forwarded position (the prompt's, then each sampled token's but the last)."""
    record: list[list[torch.Tensor]] = []
    ids: list[int] = []
    logprobs: list[float] = []
    with recorded_routing(model, record):
        out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
        while True:
            scaled = torch.log_softmax(out.logits[0, -1].float() / temperature, dim=-1)
            token = int(torch.multinomial(scaled.exp(), 1, generator=generator))
            ids.append(token)
            logprobs.append(float(scaled[token]))
            if token in stop_ids or len(ids) == max_tokens:
                break
            out = model(input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
    return ids, logprobs, stacked(record).tolist()
