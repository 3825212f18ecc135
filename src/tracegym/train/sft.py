"""SFT: a teacher's rollouts as supervised data (mode = "sft"): filtered, then rendered for the student.

Each step the orchestrator runs its groups against the teacher (any OpenAI-compatible endpoint, through the chat
client: no token ids needed) instead of the policy. A group's traces are filtered: a rollout that failed outside
the model, has no reward or was cut off by `sampling.max_tokens` is dropped, so is one below `min_reward`,
and with `keep_best` only the best of what is left (rejection sampling: best-of-`group_size` per task). Every
kept branch is then rendered with the *student's* renderer exactly as the token client would build the
student's prompts at inference (`next_prompt_ids`: the first prompt rendered, each later one bridged onto the
previous prompt and completion), with the teacher's assistant messages as the student's completion ids
(`Renderer.completion_ids`); loss falls on those completion ids only. The teacher's own template and token ids
never reach the student: a teacher of another model family gives the same samples as one of the student's.
A step with nothing left to train on is made again with new tasks (`regeneration`), then stops the run naming
the `[sft]` keys to loosen.

The trainer minimises `loss.cross_entropy_loss` on those samples (`trainer.objective = "cross_entropy"`, which the
mode sets), packed by the same token budget as RL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tracegym.core.errors import UsageError
from tracegym.core.graph import TokenPrefix
from tracegym.core.messages import Message
from tracegym.core.sample import Sample
from tracegym.core.tool_spec import ToolSpec
from tracegym.core.trace import Trace
from tracegym.envs.multi_agent import is_multi_agent
from tracegym.envs.registry import load_taskset
from tracegym.models.client import ModelRequest
from tracegym.models.endpoint import Endpoint
from tracegym.models.renderer import Renderer
from tracegym.models.token_client import next_prompt_ids
from tracegym.train.fan_out import unfit
from tracegym.train.image_inputs import rendered_images
from tracegym.train.signal import StepGroups, learner_traces


class SFTConfig(BaseModel):
    """The `[sft]` section: which of the teacher's rollouts become training data."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    min_reward: float | None = None
    """Keep a teacher rollout only when its reward is at least this (e.g. 1.0: only fully correct ones); unset:
    any scored rollout."""
    keep_best: int | None = Field(default=None, ge=1)
    """Rejection sampling: of each task's `orchestrator.group_size` teacher rollouts, keep the `keep_best` with the
    highest reward (after `min_reward`); unset: every one that passes."""
    keep_truncated: bool = False
    """Also train on a teacher reply cut off by `sampling.max_tokens` (rendered closed, it would teach the
    student to stop there)."""


# --- filters ---------------------------------------------------------------------------------------------
def sft_unfit(trace: Trace, config: SFTConfig) -> str | None:
    """Why a teacher rollout is no training data (`unfit`'s reasons, `truncated`, `below_min_reward`), or None."""
    reason = unfit(trace)
    if reason is not None:
        return reason
    if trace.is_truncated and not config.keep_truncated:
        return "truncated"
    if config.min_reward is not None and (trace.reward or 0.0) < config.min_reward:
        return "below_min_reward"
    return None


def kept_traces(group: Sequence[Trace], config: SFTConfig) -> tuple[list[Trace], Counter[str]]:
    """The rollouts of one task's group that become data (best first with `keep_best`), and the others counted
    by reason (`not_best`: passed the filters but outranked)."""
    dropped = Counter[str]()
    kept = []
    for trace in group:
        reason = sft_unfit(trace, config)
        if reason is None:
            kept.append(trace)
        else:
            dropped[reason] += 1
    if config.keep_best is not None:
        kept.sort(key=lambda t: t.reward or 0.0, reverse=True)  # stable: ties keep rollout order
        dropped["not_best"] += len(kept[config.keep_best:])
        kept = kept[: config.keep_best]
    return kept, dropped


# --- samples ---------------------------------------------------------------------------------------------
def sft_samples(trace: Trace, renderer: Renderer, tools: Sequence[ToolSpec] = ()) -> list[Sample]:
    """The student's samples of every branch of a teacher trace: token ids as the student's renderer builds them,
    loss on the assistant turns' ids only (an assistant node shared by branches carries loss once)."""
    nodes = trace.graph.nodes
    trained: set[int] = set()
    out = []
    for index, branch in enumerate(trace.graph.branches()):
        for token_ids, loss_mask in branch_tokens([nodes[i].message for i in branch], renderer, tools,
                                                  [i not in trained for i in branch]):
            if any(loss_mask):
                out.append(Sample.model_construct(
                    token_ids=token_ids, loss_mask=loss_mask, logprobs=[0.0] * len(token_ids), advantage=0.0,
                    temperature=1.0, reward=trace.reward, policy_version=None, trace_id=trace.id, branch=index,
                    task_key=trace.task_key, meta={},
                    images=rendered_images(token_ids, [nodes[i].message for i in branch], renderer)))
        trained.update(branch)
    return out


def branch_tokens(messages: Sequence[Message], renderer: Renderer, tools: Sequence[ToolSpec] = (),
                  train: Sequence[bool] | None = None) -> list[tuple[list[int], list[bool]]]:
    """(token ids, loss mask) of one conversation as the student would see it: before each assistant message the
    prompt the token client would send (bridged onto the tokens so far, or rendered in full), then the message's
    completion ids with loss (where `train[i]`, default everywhere). A full render that does not extend the
    tokens so far starts a new sequence (the earlier turns in it are context), as the message graph forks."""
    train = list(train) if train is not None else [True] * len(messages)
    sequences: list[tuple[list[int], list[bool]]] = []
    ids: list[int] = []
    mask: list[bool] = []
    covered, completion = 0, 0
    for i, message in enumerate(messages):
        if message.role != "assistant":
            continue
        prefix = TokenPrefix(ids, covered, completion) if completion else None
        prompt = next_prompt_ids(renderer, ModelRequest(list(messages[:i]), list(tools), prefix=prefix))
        if prompt[: len(ids)] != ids:  # the render does not extend what came before: a new sequence
            sequences.append((ids, mask))
            ids, mask = [], []
        mask += [False] * (len(prompt) - len(ids))
        ids = list(prompt)
        reply = renderer.completion_ids(message)
        ids += reply
        mask += [train[i]] * len(reply)
        covered, completion = i + 1, len(reply)
    sequences.append((ids, mask))
    return [(t, m) for t, m in sequences if t]


# --- the loss --------------------------------------------------------------------------------------------
# --- the teacher as a source of batches ------------------------------------------------------------------
DROPPED = "sft/dropped/"
"""The prefix of the metrics counting dropped teacher rollouts by reason."""


def check_single_agent(where: str, env_id: str, options: dict[str, Any]) -> str | None:
    """At the command line (`--dry-run` included): a UsageError naming `where` when a training environment's
    taskset is multi-agent (SFT learns from a teacher's single-agent rollouts); a taskset that cannot be imported
    here is a warning, returned: the first step refuses it."""
    try:
        taskset = load_taskset(env_id, dict(options))
    except UsageError as exc:
        return (f"{where}: taskset {env_id!r} cannot be loaded here ({exc}); mode = 'sft' refuses it at the first "
                "step if it is multi-agent")
    if is_multi_agent(taskset):
        raise UsageError(f"{where}: taskset {env_id!r} is multi-agent; mode = 'sft' trains on single-agent "
                         "environments (their teacher rollouts)")
    return None


class SFTSignal:
    """An `sft` run's signal (`train.signal`): the step's groups run against the teacher, and its rollouts that
    pass the `[sft]` filters, rendered with the student's renderer, are the samples."""

    def __init__(self, teacher: Endpoint, renderer: Renderer, config: SFTConfig) -> None:
        self.teacher, self.renderer, self.config = teacher, renderer, config

    def rollout_endpoint(self, policy: Endpoint) -> Endpoint:
        return self.teacher

    async def samples(self, step: StepGroups, version: int) -> tuple[list[Sample], dict[str, Any]]:
        """The samples of one step's groups (rendered with the tools each trace offered), stamped with the policy
        `version` served when the step started, and the step's SFT figures (`sft/kept`, `sft/kept_rate`,
        `sft/dropped/<reason>`). No sample at all is an empty batch: the orchestrator makes the step again with
        new tasks, and stops the run with `why_empty` after its last attempt."""
        samples: list[Sample] = []
        dropped = Counter[str]()
        kept = 0
        for group in step.groups:
            if not all(e.is_solo for e in group):
                raise UsageError("mode = 'sft' trains on single-agent environments; a multi-agent one is listed "
                                 "in orchestrator.train.envs")
            traces, left_out = kept_traces([t for t in learner_traces(group) if step.keeps(t)], self.config)
            dropped += left_out
            kept += len(traces)
            for trace in traces:
                samples += sft_samples(trace, self.renderer, trace.tools)
        total = kept + sum(dropped.values())
        stamped = [s.model_copy(update={"policy_version": version}) for s in samples]
        return stamped, {"sft/kept": kept, "sft/kept_rate": kept / total if total else 0.0,
                         **{f"{DROPPED}{reason}": n for reason, n in sorted(dropped.items())}}

    async def finish(self, samples: list[Sample]) -> tuple[list[Sample], dict[str, Any]]:
        return samples, {}

    def why_empty(self, tried: Sequence[dict[str, Any]]) -> str:
        """Why every attempt at a step came out empty, from the attempts' figures: what the filters dropped, and
        the `[sft]` keys to loosen."""
        dropped = Counter[str]()
        for figures in tried:
            dropped.update({k.removeprefix(DROPPED): v for k, v in figures.items() if k.startswith(DROPPED)})
        return (f"every teacher rollout was filtered out ({_counts(dropped)}); lower [sft] min_reward (now "
                f"{self.config.min_reward}), set [sft] keep_truncated, or check the teacher at {self.teacher.base_url}")

    def counts(self) -> dict[str, int]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(counter.items())) or "no rollouts"
