"""View runs: the run folders the viewer's browser tests open, made by the fakes through the code that makes real
ones: `tracegym eval` of this file's calculator taskset and of `debate` (in process, against the fake OpenAI
server), and an RL run folder (written with `RLFolder`'s own writers from scripted rollouts, as the orchestrator and
the trainer write it, with the debates as a held-out evaluation's episodes).

The eval run's traces hold what the pages must show: tool calls with their results, a fork (a reply whose
`<tool_call>` text the client re-read as a call, so the next prompt re-renders that turn and does not extend the
sampled tokens), a model error, a tool error, exact tokens with logprobs, rewards from 0 to 1 and a truncated last
line (a killed writer's).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path

import tracegym as tg
from tracegym.cli.main import main
from tracegym.core.episode import Episode
from tracegym.core.trace import Trace
from tracegym.envs.evaluate import run_group
from tracegym.models.client import ModelRequest
from tracegym.testing import Fail, FakeOpenAIServer, ScriptedModel, reply, tool_call
from tracegym.train.advantages import group_mean
from tracegym.train.filters import Gibberish, Repetition, screen
from tracegym.train.orchestrator import step_metrics
from tracegym.train.rl_folder import RLFolder
from tracegym.train.samples import trace_samples

TASKSET = "view-calc"
QUESTIONS = [(2, 3), (10, 7), (4, 4), (6, 9), (1, 1), (8, 5)]
"""The eval run's tasks: add a and b (task i is `QUESTIONS[i]`)."""
TRUNCATED_TAIL = '{"schema_version": 1, "id": "cut-off", "taskset": "view-calc", "task": {"prom'
"""What a writer killed mid-line leaves at the end of `traces.jsonl`."""


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def correct(task: tg.Task, trace: Trace) -> float:
    """1.0 when the last reply holds the sum."""
    a, b = QUESTIONS[int(task.data.key)]
    return float(str(a + b) in trace.last_reply)


def brief(task: tg.Task, trace: Trace) -> float:
    """One over the words of the last reply (a fraction, so the run's reward has decimals to check)."""
    return 1.0 / max(len(trace.last_reply.split()), 1)


def calculator(request: ModelRequest) -> object:
    """The fake model's moves, by task (read from the question): a structured call, a `<tool_call>` written as
    text (the fork), a wrong answer, a model error and a bad tool call."""
    a, b = (int(x) for x in re.findall(r"\d+", _question(request))[:2])
    done = any(m.role == "tool" for m in request.messages)
    if (a, b) == (6, 9):
        return Fail(400, "scripted: the prompt was refused")
    if done:
        return "The sum is 9, I think." if (a, b) == (4, 4) else f"The sum is {a + b}."
    if (a, b) == (10, 7):
        return f'<tool_call>{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    if (a, b) == (1, 1):
        return reply("Calling the tool.", tool_call("add", '{"a": 1, "b": '))  # malformed JSON: a tool error
    return reply(f"I will add {a} and {b}.", tool_call("add", {"a": a, "b": b}))


def _question(request: ModelRequest) -> str:
    return next(m.text for m in request.messages if m.role == "user")


def calc_taskset() -> tg.Taskset:
    rows = [{"prompt": f"What is {a} + {b}? Use the add tool.", "id": str(i)} for i, (a, b) in enumerate(QUESTIONS)]
    rows = [{**row, "system_prompt": "You are a careful calculator."} for row in rows]
    return tg.Taskset(id=TASKSET, data=rows, rewards=[correct, tg.reward(weight=0.5)(brief)], tools=[add], max_turns=4)


def byte_model(folder: Path) -> str:
    """A model directory holding the fake server's tokenizer (one token per UTF-8 byte, `scripted_model.encode`) as
    a `tokenizer.json` of byte-fallback tokens `<0xNN>`; a run naming this directory as its model shows the text of
    each token, as a run of a real model does."""
    from tokenizers import Tokenizer, decoders, models  # here: a module-level import would fail collection without it

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(vocab={f"<0x{b:02X}>": b for b in range(256)}, merges=[], byte_fallback=True))
    tokenizer.decoder = decoders.ByteFallback()
    tokenizer.save(str(folder / "tokenizer.json"))
    return str(folder)


def eval_run(output_dir: Path, model: str) -> Path:
    """`tracegym eval` of this file's taskset, 6 tasks x 2 rollouts (12 traces), against the fake server serving
    `model`."""
    with FakeOpenAIServer(rule=calculator, model=model) as server:
        evaluated(["eval", f"{__file__}:calc_taskset", "-r", "2", "--model.base-url", server.base_url,
                   "--model.name", model, "--output-dir", str(output_dir), "--no-rich", "--no-serve"])
    return only_run(output_dir)


def evaluated(args: list[str]) -> None:
    """Run `tracegym ARGS` in this process (its output kept out of the test's)."""
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    if code != 0:
        raise RuntimeError(f"tracegym {' '.join(args[:2])} exited {code}")


def only_run(output_dir: Path) -> Path:
    [run] = [p for p in output_dir.glob("*/*") if p.is_dir()]
    return run


def cut_off(run: Path) -> None:
    """End `traces.jsonl` with half a line, as a writer killed mid-write leaves it."""
    with (run / "traces.jsonl").open("a") as f:
        f.write(TRUNCATED_TAIL)


def debater_or_judge(request: ModelRequest) -> str:
    """Debaters think privately, then argue their side; the judge thinks, then picks the first side argued."""
    said = request.messages[-1].text
    side = re.findall(r"\(([A-D])\)", said)[0]
    if "VERDICT" in said:
        return f"<think>Both were brief; ({side}) was argued first.</think>I find ({side}) convincing.\nVERDICT: {side}"
    return (f"<think>private plan: stress ({side}) and never concede</think>The answer is ({side}): it fits every "
            "clue in the question.")


def debate_run(output_dir: Path, model: str) -> Path:
    """`tracegym eval debate` (1 round, 2 debates) against the fake server: episodes of two debaters and a judge."""
    with FakeOpenAIServer(rule=debater_or_judge, model=model) as server:
        evaluated(["eval", "debate", "-n", "2", "--taskset.rounds", "1", "--model.base-url", server.base_url,
                   "--model.name", model, "--output-dir", str(output_dir), "--no-rich", "--no-serve"])
    return only_run(output_dir)


RL_STEPS = 4
RL_GROUP = 4
WORDS = ["tracegym", "viewer", "browser"]
"""The RL run's tasks: reverse each word."""


def reverser(step: int) -> Callable[[ModelRequest], str]:
    """The policy of `step`: of each group of 4, `step` rollouts reverse the word right (the curve rises)."""
    turns = iter(range(10**6))

    def answer(request: ModelRequest) -> str:
        word = request.messages[-1].text.split()[-1]
        return word[::-1] if next(turns) % RL_GROUP < step else word
    return answer


def exact(task: tg.Task, trace: Trace) -> float:
    """1.0 when the reply is the reversed word."""
    return float(trace.last_reply.strip() == task.data.answer)


def rl_run(output_dir: Path, model: str) -> Path:
    """An RL run folder of 4 steps as the orchestrator and trainer leave it: per step its traces (exact tokens,
    the policy version that sampled them), its batch of samples with group advantages, its metrics record and
    the trainer's; a held-out evaluation at steps 0 and 4; the config (naming `model`) and the served policy."""
    folder = RLFolder.create(output_dir, "view-rl")
    folder.write_config({"mode": "rl", "steps": RL_STEPS, "model": {"name": model},
                         "orchestrator": {"tasks_per_step": len(WORDS), "group_size": RL_GROUP,
                                          "train": {"envs": [{"id": "reverse-word"}]}}})
    taskset = tg.Taskset(id="reverse-word", data=[{"prompt": f"Reverse the word {w}", "answer": w[::-1]}
                                                   for w in WORDS], rewards=[exact])
    for step in range(RL_STEPS):
        model = ScriptedModel(rule=reverser(step), tokens=True)
        model.policy_version = step
        groups = [asyncio.run(run_group(taskset, data, model, RL_GROUP)) for data in taskset]
        samples = [sample.model_copy(update={"advantage": advantage, "reward": trace.reward})
                   for group in groups
                   for trace, advantage in zip(group, group_mean([t.reward or 0.0 for t in group]), strict=True)
                   for sample in trace_samples(trace)]
        metrics = step_metrics(groups, samples, 0.5 + 0.1 * step)
        metrics.update(policy_version=step, staleness=0, groups_filtered=0, samples_dropped_stale=0)
        metrics.update(screen([Gibberish(), Repetition()], (("reverse-word", t) for g in groups for t in g)).metrics())
        folder.write_episodes(step, [Episode.solo(t) for g in groups for t in g])
        folder.write_batch(step, samples, metrics)
        folder.metrics.append({"step": step, **metrics})
        folder.trainer_metrics.append({"step": step, "loss": 0.7 - 0.1 * step, "grad_norm": 1.0 / (step + 1),
                                       "train_s": 0.2, "weight_sync_s": 0.05})
        folder.publish_policy(step + 1, "policy")
        if step == 0:
            folder.metrics.append({"eval_step": 0, "env": "reverse-word", "policy_version": 0, "eval_reward": 0.1,
                                   "eval_reward_ci95": 0.05, "eval_n": 3, "eval_unscored": 0})
    folder.metrics.append({"eval_step": RL_STEPS, "env": "reverse-word", "policy_version": RL_STEPS,
                           "eval_reward": 0.8, "eval_reward_ci95": 0.1, "eval_n": 3, "eval_unscored": 0})
    return folder.path


def held_out_debates(rl: Path, debate: Path) -> None:
    """The debate run's episodes, each with its members' traces, written into the RL run as a held-out
    multi-agent environment's evaluation at its last step (as the orchestrator writes one)."""
    traces = [Trace.model_validate_json(line) for line in (debate / "traces.jsonl").read_text().splitlines()]
    episodes = [Episode.model_validate_json(line) for line in (debate / "episodes.jsonl").read_text().splitlines()]
    for episode in episodes:
        episode.traces = {t.member: t for t in traces if t.episode_id == episode.id and t.member}
    RLFolder(rl).write_episodes(RL_STEPS, episodes, held_out="eval:debate")

