"""Run folders for the viewer's fast tests, written by the code that writes real ones (an eval run's episode log,
RunFolder's config and summary, RLFolder) from traces and episodes made by `tracegym.testing`'s builders."""

from __future__ import annotations

import json
from pathlib import Path

from tracegym.config.episode_log import EpisodeLog
from tracegym.core.episode import Episode
from tracegym.core.errors import ErrorKind, TraceError
from tracegym.core.messages import Message, ToolCall, assistant, system, tool, user
from tracegym.core.task_data import TaskData
from tracegym.core.timing import Span
from tracegym.core.trace import RewardScore, StopReason, Trace, Usage
from tracegym.eval.episode_summary import summarize_episodes
from tracegym.eval.run_folder import EPISODES, TRACES, RunFolder
from tracegym.eval.summary import summarize
from tracegym.testing import make_episode, make_trace
from tracegym.train.rl_folder import RLFolder
from tracegym.train.samples import trace_samples

CORRUPT = b'{"schema_version": 1, "id": "broken", "task": {{{ not json\n'
NEWER = json.dumps({"schema_version": 99, "id": "from-the-future", "task": {"prompt": "x"}}).encode() + b"\n"
TAIL = b'{"schema_version": 1, "id": "cut-off", "taskset": "calc", "task": {"prom'


def tool_trace(rollout_index: int = 0, *, policy_version: int | None = None, result: str = "5") -> Trace:
    """A multi-turn trace: system, user, a tool call and its `result` (node 3), an environment response, exact
    tokens with logprobs, spans, two rewards and a metric."""
    trace = Trace(task=TaskData(prompt="what is 2+3?", answer="5"), taskset="calc", rollout_index=rollout_index,
                  model="fake-model", stop_reason=StopReason.COMPLETED, usage=Usage(prompt_tokens=30,
                                                                                   completion_tokens=9))
    graph = trace.graph
    graph.add(system("You add numbers."))
    graph.add(user("what is 2+3?"))
    trace.prompt_length = 2
    call = ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')
    graph.add_model_turn(assistant(None, [call]), prompt_ids=[1, 2, 3], completion_ids=[4, 5],
                         completion_logprobs=[-0.1, -2.5], temperature=1.0, policy_version=policy_version)
    graph.add(tool(result, tool_call_id="c1", name="add"))
    graph.add(user("Are you sure? Say it in words."))
    graph.add_model_turn(assistant("It is five (5)."), prompt_ids=[1, 2, 3, 4, 5, 6, 7], completion_ids=[8, 9],
                         completion_logprobs=[-0.3, -0.01], temperature=1.0, policy_version=policy_version)
    trace.rewards = {"correct": RewardScore(score=1.0), "brief": RewardScore(score=0.25, weight=0.5)}
    trace.metrics = {"words": 4.0}
    trace.spans = [Span(name="setup", start=0.0, end=0.01), Span(name="model", start=0.01, end=0.4, turn=0),
                   Span(name="tool:add", start=0.4, end=0.45, turn=0), Span(name="model", start=0.5, end=0.9, turn=1),
                   Span(name="scoring", start=0.9, end=0.95), Span(name="total", start=0.0, end=0.95)]
    trace.errors = [TraceError(kind=ErrorKind.TOOL, stage="tool:add", message="add was slow", turn=0)]
    return trace


def plain_traces() -> list[Trace]:
    """Single-turn traces over three tasks: rewards 0, 1 and unscored, model errors, a truncation, two tasksets."""
    traces = []
    for i in range(9):
        task = TaskData(prompt=f"reverse word{i % 3}")
        reward = [1.0, 0.0, None][i % 3]
        error = ErrorKind.MODEL if i == 4 else None
        stop = StopReason.TRUNCATED if i == 7 else StopReason.COMPLETED
        traces.append(make_trace(task.prompt, f"{i % 3}drow", reward=reward, task=task, rollout_index=i // 3,
                                 error=error, stop_reason=stop, taskset="rev" if i < 6 else "rev-hard",
                                 usage=Usage(prompt_tokens=10 + i, completion_tokens=i)))
    return traces


def episode_log(run: Path) -> EpisodeLog:
    """The episode log of the eval run folder at `run`."""
    return EpisodeLog(run / TRACES, run / EPISODES)


def eval_folder(root: Path, *, broken: bool = True) -> Path:
    """An eval run: plain traces, one tool trace (each its solo episode), its summary.json; with `broken`, a
    corrupt line, a line of a newer schema and a truncated last line after them (no summary counts those)."""
    folder = RunFolder.create(root, "calc", "fake-model", run_id="run")
    folder.write_config({"taskset": "calc", "model": {"name": "fake-model"}, "rollouts": 3})
    traces = [*plain_traces(), tool_trace()]
    log = episode_log(folder.path)
    for trace in traces:
        log.append(Episode.solo(trace))
    log.close()
    folder.write_summary(summarize(traces).model_dump(mode="json"))
    if broken:
        with log.traces.open("ab") as f:
            f.write(CORRUPT + NEWER + TAIL)
    return folder.path


def long_message_folder(root: Path, text: str) -> Path:
    """An eval run of one trace, `tool_trace`, whose tool result (node 3) is `text`."""
    folder = RunFolder.create(root, "calc", "fake-model", run_id="run")
    log = episode_log(folder.path)
    log.append(Episode.solo(tool_trace(result=text)))
    log.close()
    return folder.path


def long_member_folder(root: Path, text: str) -> tuple[Path, int]:
    """A multi-agent eval run of one episode whose member `debater_a` was told `text` by `debater_b`; the id of
    that node in debater_a's trace."""
    folder = RunFolder.create(root, "debate", "fake-model", run_id="run")
    episode = make_episode({"debater_a": 1.0, "debater_b": 0.0}, taskset="debate")
    node = episode.traces["debater_a"].graph.add(Message(role="user", content=text, name="debater_b"))
    log = episode_log(folder.path)
    log.append(episode)
    log.close()
    return folder.path, node.id


def episodes_folder(root: Path) -> Path:
    """A multi-agent eval run: two debates (debaters and a judge) and their summary."""
    folder = RunFolder.create(root, "debate", "fake-model", run_id="run")
    folder.write_config({"taskset": "debate", "model": {"name": "fake-model"}})
    episodes = [make_episode({"debater_a": 1.0, "debater_b": 0.0, "judge": 1.0}, taskset="debate",
                             metrics={"rounds": 2.0}),
                make_episode({"debater_a": 0.0, "debater_b": 1.0, "judge": None}, taskset="debate",
                             error=TraceError(kind=ErrorKind.TASK, stage="settle",
                                              message="member 'judge' gave no 'VERDICT: X' line"))]
    log = episode_log(folder.path)
    for episode in episodes:
        log.append(episode)
    log.close()
    folder.write_summary(summarize_episodes(episodes).model_dump(mode="json"))
    return folder.path


def rl_folder(root: Path) -> Path:
    """An RL run of two steps: each step's single-agent rollouts, batch (advantages) and metrics, a held-out
    evaluation (its record, and a held-out multi-agent environment's episode at step 1) and the trainer's
    records."""
    folder = RLFolder.create(root, run_id="rl")
    folder.write_config({"model": {"name": "fake-model"}, "orchestrator": {"group_size": 2}})
    for step in range(2):
        traces = [tool_trace(i, policy_version=step) for i in range(2)]
        traces[1].rewards["correct"] = RewardScore(score=0.0)
        folder.write_episodes(step, [Episode.solo(t) for t in traces])
        samples = [s.model_copy(update={"advantage": 0.5 - i}) for i, t in enumerate(traces)
                   for s in trace_samples(t)]
        folder.write_batch(step, samples)
        folder.metrics.append({"step": step, "reward": 0.5 + step / 4, "completion_tokens_mean": 9.0,
                               "staleness": 0, "policy_version": step, "rollouts": 2, "samples": 2})
        folder.trainer_metrics.append({"step": step, "loss": 1.0 - step / 2})
    folder.metrics.append({"eval_step": 2, "env": "calc", "policy_version": 2, "eval_reward": 0.75})
    folder.write_episodes(1, [make_episode({"debater_a": 1.0, "debater_b": 0.0}, taskset="debate")],
                          held_out="eval:debate")
    return folder.path


def files_of(path: Path) -> dict[str, tuple[int, int]]:
    """Every file under `path` with its size and modification time: equal before and after means untouched."""
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(path.rglob("*"))}
