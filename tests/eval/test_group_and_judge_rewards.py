"""Group rewards and judge rewards through `tracegym eval` and `tracegym rescore`: a resume reruns a task's group
whole, a rescore scores each task's stored rollouts as a group again, a judge's calls land in the run folder, a judge
failure is counted as one, and `--repeat` asks the judge afresh each time."""

import itertools
import json
import threading

import tracegym as tg
from tracegym.cli.main import main
from tracegym.core.trace import RewardScore
from tracegym.envs.rollout import Timeouts
from tracegym.eval.rescore import rescore
from tracegym.testing import Fail, FakeOpenAIServer, ScriptedModel

QA = '''
import tracegym as tg


class QAConfig(tg.TasksetConfig):
    judge_url: str = "http://127.0.0.1:9/v1"


class QA(tg.Taskset[QAConfig]):
    id = "qa"

    def load(self):
        return [{"prompt": "What is 2+2?", "answer": "4", "id": "sum"}]


def qa(config=None):
    plain = QA(config)
    judge = tg.Endpoint(base_url=plain.config.judge_url, model="judge", api_key_env=None, max_retries=0)
    return QA(plain.config, rewards=[tg.Judge(judge)])
'''


@tg.reward(group=True)
def first_to_finish(task, traces):
    """1 for the lowest rollout index of the group (a stand-in for any comparison among the group)."""
    return [float(t.rollout_index == min(x.rollout_index for x in traces)) for t in traces]


def eval_run(tmp_path, module, policy, judge, rollouts=2, code=0):
    assert main(["eval", f"{module}:qa", "-r", str(rollouts), "--model.base-url", policy.base_url, "--no-serve",
                 "--taskset.judge-url", judge.base_url, "--output-dir", str(tmp_path / "out"), "--no-rich"]) == code
    [run] = list((tmp_path / "out").glob("*/*"))
    return run


def qa_module(tmp_path):
    module = tmp_path / "qa.py"
    module.write_text(QA)
    return module


async def test_rescore_scores_each_task_s_stored_rollouts_as_one_group_again():
    taskset = tg.Taskset(id="first", data=[{"prompt": "a"}, {"prompt": "b"}], rewards=[first_to_finish])
    traces = await tg.evaluate(taskset, ScriptedModel(["done"]), rollouts=2)
    stale = [t.model_copy(update={"rewards": {"first_to_finish": RewardScore(score=0.5)}}) for t in traces]
    result = await rescore(taskset, stale, Timeouts())
    assert [(t.task_key, t.rollout_index, t.reward) for t in result.traces] == [
        ("0", 0, 1.0), ("0", 1, 0.0), ("1", 0, 1.0), ("1", 1, 0.0)]


async def test_rescore_leaves_a_trace_that_ended_on_an_error_out_of_its_group():
    taskset = tg.Taskset(id="first", data=[{"prompt": "a"}], rewards=[first_to_finish])
    model = ScriptedModel(rule=lambda r: Fail(400, "bad") if r.sampling.seed == 0 else "done")
    traces = await tg.evaluate(taskset, model, rollouts=2, sampling=tg.Sampling(seed=0))
    result = await rescore(taskset, traces, Timeouts())
    assert [t.reward for t in result.traces] == [None, 1.0]  # rollout 1 is the first of the group that finished


def test_a_judge_s_calls_are_kept_in_the_run_folder(tmp_path):
    with FakeOpenAIServer(rule=lambda r: "4") as policy, FakeOpenAIServer(["VERDICT: yes"], model="judge") as judge:
        run = eval_run(tmp_path, qa_module(tmp_path), policy, judge)
    traces = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    assert [[(j["score"], j["cached"]) for j in t["judgments"]] for t in traces] in (
        [[(1.0, False)], [(1.0, True)]], [[(1.0, True)], [(1.0, False)]])
    assert json.loads((run / "summary.json").read_text())["reward"] == 1.0


def test_show_prints_each_judge_call_of_a_trace(tmp_path, capsys):
    with FakeOpenAIServer(rule=lambda r: "4") as policy, FakeOpenAIServer(["VERDICT: yes"], model="judge") as judge:
        run = eval_run(tmp_path, qa_module(tmp_path), policy, judge, rollouts=1)
    capsys.readouterr()
    assert main(["show", str(run), "-n", "1"]) == 0
    assert "judge judge (judge): 1, said 'VERDICT: yes'" in capsys.readouterr().out


def test_a_judge_that_cannot_answer_is_counted_as_a_judge_failure_not_a_zero(tmp_path):
    with FakeOpenAIServer(rule=lambda r: "4") as policy, FakeOpenAIServer([Fail(500, "down")], model="judge") as judge:
        run = eval_run(tmp_path, qa_module(tmp_path), policy, judge, code=1)  # every rollout failed: exit 1
    summary = json.loads((run / "summary.json").read_text())
    assert summary["reward"] is None and summary["failures"] == {"judge_error": 2}
    assert summary["errors_by_kind"]["judge"] == 2


def test_rescore_repeat_asks_the_judge_afresh_each_time(tmp_path, capsys):
    said = itertools.cycle(["yes", "no"])
    lock = threading.Lock()

    def flipping(request):
        with lock:
            return f"VERDICT: {next(said)}"

    module = qa_module(tmp_path)
    with FakeOpenAIServer(rule=lambda r: "4") as policy, FakeOpenAIServer(rule=flipping, model="judge") as judge:
        run = eval_run(tmp_path, module, policy, judge, rollouts=1)
        capsys.readouterr()
        assert main(["rescore", str(run), "--repeat", "4"]) == 0
    assert len(judge.requests) == 1 + 4
    assert "judge: 1 of 1 traces changed across 4 rescorings" in capsys.readouterr().out


GROUPED = """
import tracegym as tg


@tg.reward(group=True)
def first_done(task, traces):
    return [float(t.rollout_index == min(x.rollout_index for x in traces)) for t in traces]


grouped = tg.Taskset(id="grouped", data=[{"prompt": "a"}, {"prompt": "b"}], rewards=[first_done])
"""


def test_resume_reruns_the_whole_group_of_a_task_with_a_rollout_to_redo(tmp_path):
    module = tmp_path / "grouped.py"
    module.write_text(GROUPED)
    failed = threading.Event()
    asked: list[str] = []

    def once_down(request):  # the first request for task "a" fails: its rollout ends on a model error
        asked.append(request.messages[-1].text)
        if request.messages[-1].text == "a" and not failed.is_set():
            failed.set()
            return Fail(400, "bad request")
        return "done"

    with FakeOpenAIServer(rule=once_down) as policy:
        assert main(["eval", f"{module}:grouped", "-r", "2", "--model.base-url", policy.base_url, "--no-serve",
                     "--max-error-rate", "1", "--output-dir", str(tmp_path / "out"), "--no-rich"]) == 0
        [run] = list((tmp_path / "out").glob("*/*"))
        asked.clear()
        assert main(["eval", "--resume", str(run), "--no-rich"]) == 0
    assert sorted(asked) == ["a", "a"]
    records = [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]
    scores = sorted((r["task_key"], r["rollout_index"], r["rewards"]["first_done"]["score"]) for r in records)
    assert scores == [("0", 0, 1.0), ("0", 1, 0.0), ("1", 0, 1.0), ("1", 1, 0.0)]


SHORTEST = """
import tracegym as tg


class Answer(tg.Task):
    @tg.reward
    def correct(self, trace):
        return float(trace.last_reply.strip() == self.data.answer)

    @tg.reward(group=True)
    def shortest_correct(self, traces):
        right = [len(t.last_reply) for t in traces if t.rewards["correct"].score == 1.0]
        return [float(t.rewards["correct"].score == 1.0 and len(t.last_reply) == min(right)) for t in traces]


class Answers(tg.Taskset):
    id = "answers"
    task_class = Answer

    def load(self):
        return [{"prompt": "2+2?", "answer": "4"}]
"""


def test_validate_scores_a_group_reward_on_each_agent_s_rollout_as_a_group_of_one(tmp_path, capsys):
    module = tmp_path / "answers.py"
    module.write_text(SHORTEST)
    assert main(["validate", f"{module}:Answers"]) == 0
    out = capsys.readouterr().out
    assert "gold:  1 of 1 passed" in out
    assert "group scorers (shortest_correct) scored each rollout as a group of one" in out
