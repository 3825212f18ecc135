"""`tracegym validate`: a task whose gold reply fails and a task that pays an empty reply are both named, exit 1;
a clean taskset exits 0; built-in tasksets validate clean; a multi-agent taskset is refused in one line."""

import pytest

import tracegym as tg
from tracegym.cli.main import main

PLANTED = '''
import tracegym as tg


class Planted(tg.Task):
    @tg.reward
    def exact(self, trace):
        if self.data.id == "free":  # pays whatever the agent does: free reward
            return 1.0
        if self.data.id == "broken":  # compares with the wrong thing: its gold can never pass
            return float(trace.last_reply.strip() == self.data.answer[::-1])
        return float(trace.last_reply.strip() == self.data.answer)


class PlantedSet(tg.Taskset):
    id = "planted"
    task_class = Planted

    def load(self):
        return [{"id": "fine", "prompt": "abc", "answer": "cba"}, {"id": "free", "prompt": "x", "answer": "x"},
                {"id": "broken", "prompt": "ab", "answer": "ba"}]


class CleanSet(PlantedSet):
    id = "clean"

    def load(self):
        return [{"id": "fine", "prompt": "abc", "answer": "cba"}]
'''


@pytest.fixture
def planted(tmp_path):
    path = tmp_path / "planted.py"
    path.write_text(PLANTED)
    return path


def test_a_planted_noop_pass_and_a_planted_gold_failure_are_named_and_exit_1(planted, capsys):
    assert main(["validate", f"{planted}:PlantedSet"]) == 1
    out = capsys.readouterr().out
    assert "  gold:  2 of 3 passed (reward >= 1)" in out and "  no-op: 1 of 3 paid more than 0" in out
    assert "gold fails   broken: reward 0.0" in out and "no-op passes free: reward 1.0" in out
    assert "fine:" not in out


def test_a_clean_taskset_exits_0(planted, capsys):
    assert main(["validate", f"{planted}:CleanSet"]) == 0
    assert "1 of 1 passed" in capsys.readouterr().out


@pytest.mark.parametrize("taskset", ["reverse-text", "alphabet-sort", "arithmetic", "wordle", "tool-calculator"])
def test_a_built_in_taskset_validates_clean(taskset, capsys):
    assert main(["validate", taskset, "-n", "4"]) == 0, capsys.readouterr().out
    assert "gold:  4 of 4 passed" in capsys.readouterr().out


def test_a_taskset_without_gold_replies_says_they_were_not_checked(capsys):
    assert main(["validate", "counter-env", "-n", "2"]) == 0
    assert "2 have no gold reply (Task.gold), not checked" in capsys.readouterr().out


def test_a_multi_agent_taskset_is_refused_in_one_line(capsys):
    assert main(["validate", "kuhn-poker", "-n", "1"]) == 2
    assert "validate: taskset 'kuhn-poker' is multi-agent" in capsys.readouterr().err


def test_the_gold_reply_defaults_to_the_rows_answer_as_text():
    taskset = tg.Taskset(id="t", data=[{"prompt": "1+1", "answer": 2}, {"prompt": "open"}])
    assert [taskset.task(row).gold() for row in taskset] == ["2", None]


def test_rl_validate_stops_before_anything_starts_when_a_training_environment_is_not_clean(planted, tmp_path, capsys):
    args = ["rl", "--validate", "--orchestrator.train.envs", f'[{{"id": "{planted}:PlantedSet"}}]',
            "--output-dir", str(tmp_path / "runs")]
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "no-op passes free" in captured.out and "--validate: a training environment is not clean" in captured.err
    assert not (tmp_path / "runs").exists()


def test_rl_validate_goes_on_when_every_training_environment_is_clean(planted, capsys):
    args = ["rl", "--validate", "--dry-run", "--orchestrator.train.envs", f'[{{"id": "{planted}:CleanSet"}}]']
    assert main(args) == 0
    assert "validate clean: 1 tasks" in capsys.readouterr().out
