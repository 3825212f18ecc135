"""Re-scoring stored traces: class-based environments rebuilt by replay, a replay whose tools answer differently
reported as diverged and left unscored, errored traces left unscored, the loop's own metrics kept, taskset options
applied, and rescore outputs that never overwrite each other."""

import json
import re
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.cli.main import main
from tracegym.core.trace import RewardScore
from tracegym.envs.rollout import Timeouts
from tracegym.eval.rescore import rescore, rescore_trace
from tracegym.testing import FakeOpenAIServer, ScriptedModel, reply, tool_call
from tracegym.testing.script import Fail

RULES = re.compile(r"starts at (\d+) and the target is (\d+)\. Each call moves it by 1 to (\d+)")
COUNT = re.compile(r"The counter is (?:now|at) (-?\d+)")


def stepper(request):
    """A first call too big for the rules (a tool error), then steps toward the target, then `done`."""
    start, target, step = map(int, RULES.search(request.messages[0].text).groups())
    if not any(m.role == "tool" for m in request.messages):
        return reply(None, tool_call("increment", {"amount": 99}))
    counts = [int(n) for m in request.messages if m.role == "tool" for n in COUNT.findall(m.text)]
    count = counts[-1] if counts else start
    if count == target:
        return "done"
    name = "increment" if target > count else "decrement"
    return reply(None, tool_call(name, {"amount": min(step, abs(target - count))}))


def zeroed(trace):
    """The trace as if an old reward function had scored it 0 and an old metric had said 99."""
    old = trace.model_copy(deep=True)
    old.rewards = {name: RewardScore(score=0.0, weight=r.weight) for name, r in old.rewards.items()}
    old.metrics = {**old.metrics, "distance": 99.0}
    return old


async def counter_traces():
    taskset = tg.load_taskset("counter-env")
    return taskset, await tg.evaluate(taskset, ScriptedModel(rule=stepper), num_tasks=2)


async def test_replay_rebuilds_a_class_based_environment_so_the_reward_is_right_again():
    taskset, traces = await counter_traces()
    assert [t.reward for t in traces] == [1.0, 1.0] and all(t.metrics["tool_errors"] == 1 for t in traces)
    rescored = [await rescore_trace(taskset, zeroed(t), Timeouts()) for t in traces]
    assert [t.reward for t in rescored] == [1.0, 1.0]
    assert [t.metrics["distance"] for t in rescored] == [0.0, 0.0]


async def test_rescore_keeps_the_loops_own_metrics():
    taskset, traces = await counter_traces()
    rescored = [await rescore_trace(taskset, zeroed(t), Timeouts()) for t in traces]
    assert [t.metrics["tool_calls"] for t in rescored] == [t.metrics["tool_calls"] for t in traces]
    assert [t.metrics["tool_errors"] for t in rescored] == [t.metrics["tool_errors"] for t in traces]


async def test_a_trace_that_stopped_on_an_error_stays_unscored():
    taskset = tg.load_taskset("reverse-text")
    [trace] = await tg.evaluate(taskset, ScriptedModel([Fail(status=400)]), num_tasks=1)
    assert trace.stop_reason == "error" and trace.reward is None
    rescored = await rescore_trace(taskset, trace, Timeouts())
    assert rescored.reward is None and rescored.stop_reason == "error"
    assert [r.score for r in rescored.rewards.values()] == [None] and rescored.errors == trace.errors


SAY_HELLO = '''
from tracegym.envs.taskset import Taskset, TasksetConfig


class SayConfig(TasksetConfig):
    ignore_case: bool = False
    """Accept HELLO and Hello too."""


class Say(Taskset):
    Config = SayConfig

    def __init__(self, config=None):
        super().__init__(config, id="say", data=[{"prompt": "Say hello."}], rewards=[self.said_hello])

    def said_hello(self, task, trace):
        reply = trace.last_reply.lower() if self.config.ignore_case else trace.last_reply
        return float(reply == "hello")
'''


@pytest.fixture
def say_run(tmp_path) -> Path:
    """A finished run of a taskset whose reward depends on its `ignore_case` option (answered `Hello`)."""
    module = tmp_path / "say.py"
    module.write_text(SAY_HELLO)
    with FakeOpenAIServer(rule=lambda request: "Hello") as server:
        assert main(["eval", f"{module}:Say", "-r", "2", "--model.base-url", server.base_url, "--no-serve",
                     "--output-dir", str(tmp_path / "out"), "--no-rich"]) == 0
    [run] = list((tmp_path / "out").glob("*/*"))
    assert json.loads((run / "summary.json").read_text())["reward"] == 0.0
    return run


def test_a_taskset_option_given_to_rescore_changes_the_rewards(say_run):
    assert main(["rescore", str(say_run), "--taskset.ignore-case", "true"]) == 0
    [summary] = list(say_run.glob("summary.rescored-*.json"))
    assert json.loads(summary.read_text())["reward"] == 1.0


def test_two_rescores_in_the_same_second_write_separate_files(say_run, monkeypatch):
    monkeypatch.setattr("time.strftime", lambda *args: "20260101-000000-")
    assert main(["rescore", str(say_run)]) == 0
    assert main(["rescore", str(say_run), "--taskset.ignore-case", "true"]) == 0
    assert len(list(say_run.glob("traces.rescored-*.jsonl"))) == 2
    assert sorted(json.loads(p.read_text())["reward"] for p in say_run.glob("summary.rescored-*.json")) == [0.0, 1.0]


DICE = '''
import itertools

import tracegym as tg


class Dice:
    \"\"\"A die that rolls differently in every instance (a game seeded afresh each time it is built).\"\"\"

    instances = itertools.count(1)

    def reset(self, **fields):
        self.seed = next(Dice.instances)
        self.rolled = []

    def roll(self) -> int:
        \"\"\"Roll the die.

        Args:
        \"\"\"
        self.rolled.append(self.seed % 6 + 1)
        return self.rolled[-1]


def even(task, trace):
    return float(sum(task.env.rolled) % 2 == 0)


class DiceGame(tg.EnvironmentTaskset):
    def __init__(self, config=None):
        super().__init__(Dice, config=config, id="dice", data=[{"prompt": "Roll twice."}], rewards=[even])
'''


def roll_twice(request):
    answered = sum(1 for m in request.messages if m.role == "tool")
    return reply(None, tool_call("roll", id=f"r{answered}")) if answered < 2 else "done"


@pytest.fixture
def dice_module(tmp_path):
    module = tmp_path / "dice.py"
    module.write_text(DICE)
    return module


async def dice_traces(dice_module, rollouts=2):
    taskset = tg.load_taskset(f"{dice_module}:DiceGame")
    return taskset, await tg.evaluate(taskset, ScriptedModel(rule=roll_twice), rollouts=rollouts)


async def test_a_replay_whose_tool_answers_differ_is_reported_as_diverged(dice_module):
    taskset, traces = await dice_traces(dice_module)
    result = await rescore(taskset, traces, Timeouts())
    assert [(d.task_key, d.rollout_index, d.call, d.tool) for d in result.diverged] == [
        (traces[0].task_key, 0, 1, "roll"), (traces[1].task_key, 1, 1, "roll")]
    assert [d.stored for d in result.diverged] == [t.messages[2].text for t in traces]
    assert all(d.replayed.isdigit() and d.replayed != d.stored for d in result.diverged)


async def test_a_diverged_trace_is_left_unscored_with_the_reason_on_it(dice_module):
    taskset, traces = await dice_traces(dice_module, rollouts=1)
    assert traces[0].reward is not None
    [rescored] = (await rescore(taskset, traces, Timeouts())).traces
    assert rescored.reward is None and [r.score for r in rescored.rewards.values()] == [None]
    [error] = [e for e in rescored.errors if e.stage == "rescore"]
    assert "diverged at tool call 1 (roll)" in error.message


async def test_a_deterministic_environment_replays_without_divergence():
    taskset, traces = await counter_traces()
    result = await rescore(taskset, [zeroed(t) for t in traces], Timeouts())
    assert result.diverged == [] and [t.reward for t in result.traces] == [1.0, 1.0]


def test_rescore_command_lists_diverged_traces_and_writes_them_to_its_summary(dice_module, tmp_path, capsys):
    with FakeOpenAIServer(rule=roll_twice) as server:
        assert main(["eval", f"{dice_module}:DiceGame", "-r", "2", "--model.base-url", server.base_url, "--no-serve",
                     "--output-dir", str(tmp_path / "out"), "--no-rich"]) == 0
    [run] = list((tmp_path / "out").glob("*/*"))
    capsys.readouterr()
    assert main(["rescore", str(run)]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 traces diverged on replay" in out and "#1: tool call 1 (roll): stored" in out
    [summary] = list(run.glob("summary.rescored-*.json"))
    diverged = json.loads(summary.read_text())["diverged"]
    assert [(d["rollout_index"], d["call"], d["tool"]) for d in diverged] == [(0, 1, "roll"), (1, 1, "roll")]


async def test_an_environment_whose_reset_exits_fails_only_that_traces_rescore(monkeypatch):
    taskset, traces = await counter_traces()
    from tracegym.tasksets.counter_env import CounterEnv

    real_reset = CounterEnv.reset

    def reset(self, **kwargs):
        if kwargs.get("start") == traces[0].task.model_dump().get("start"):
            raise SystemExit(3)
        return real_reset(self, **kwargs)

    monkeypatch.setattr(CounterEnv, "reset", reset)
    first, second = [await rescore_trace(taskset, zeroed(t), Timeouts()) for t in traces]
    assert first.reward is None and "SystemExit: 3" in first.errors[-1].message
    assert second.reward == 1.0


NOISY = '''
import itertools

from tracegym.envs.taskset import Taskset

VERDICTS = itertools.count()


class Judged(Taskset):
    def __init__(self, config=None):
        super().__init__(config, id="judged", data=[{"prompt": "Say hello."}], rewards=[self.judge, self.exact])

    def judge(self, task, trace):  # a judge that says yes every third time it is asked
        return float(next(VERDICTS) % 3 == 0)

    def exact(self, task, trace):
        return float(trace.last_reply == "hello")
'''


def test_rescore_repeat_reports_how_much_each_reward_moved_across_rescorings(tmp_path, capsys):
    module = tmp_path / "judged.py"
    module.write_text(NOISY)
    with FakeOpenAIServer(rule=lambda request: "hello") as server:
        assert main(["eval", f"{module}:Judged", "-r", "2", "--model.base-url", server.base_url, "--no-serve",
                     "--output-dir", str(tmp_path / "out"), "--no-rich"]) == 0
    [run] = list((tmp_path / "out").glob("*/*"))
    capsys.readouterr()
    assert main(["rescore", str(run), "--repeat", "4"]) == 0
    assert "judge: 2 of 2 traces changed across 4 rescorings" in capsys.readouterr().out
    [summary] = list(run.glob("summary.rescored-*.json"))
    noise = json.loads(summary.read_text())["noise"]
    assert (noise["exact"]["changed"], noise["exact"]["within_std"], noise["exact"]["run_mean_ci95"]) == (0, 0.0, 0.0)
    assert noise["judge"]["within_std"] > 0 and noise["judge"]["run_mean_ci95"] > 0


@pytest.mark.parametrize("value", ["0", "x"])
def test_rescore_repeat_must_be_a_positive_count(say_run, value, capsys):
    assert main(["rescore", str(say_run), "--repeat", value]) == 2
    assert f"--repeat {value!r}: the number of times to score each trace" in capsys.readouterr().err
