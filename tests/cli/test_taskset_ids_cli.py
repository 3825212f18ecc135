"""Taskset ids through `tracegym eval`: a ready-made instance, a zero-argument factory, a file beside a module."""

import pytest

from tracegym.cli.main import main
from tracegym.testing import FakeOpenAIServer

TASKS = '''
import tracegym as tg
from beside_words import WORDS


class Words(tg.Taskset):
    id = "words"

    def load(self):
        return [{"prompt": w, "answer": w} for w in WORDS]


def make_words():
    return Words()


READY = Words({"seed": 5})
'''


@pytest.fixture
def tasks_file(tmp_path):
    (tmp_path / "beside_words.py").write_text("WORDS = ['ab', 'cd']\n")
    path = tmp_path / "word_tasks.py"
    path.write_text(TASKS)
    return path


@pytest.mark.parametrize("name", ["READY", "make_words", "Words"])
def test_every_kind_of_file_taskset_runs_through_the_served_eval(name, tasks_file, tmp_path, capsys):
    """The env server's workers rebuild the tasks from the same file, which imports a module beside it."""
    with FakeOpenAIServer(rule=lambda request: request.messages[-1].text) as server:
        code = main(["eval", f"{tasks_file}:{name}", "-r", "1", "--model.base-url", server.base_url,
                     "--output-dir", str(tmp_path / "out"), "--no-rich"])
    assert code == 0, capsys.readouterr().err
    assert "errors none" in capsys.readouterr().out


def test_dry_run_of_a_ready_made_instance_shows_its_own_options(tasks_file, capsys):
    assert main(["eval", f"{tasks_file}:READY", "--dry-run"]) == 0
    assert "seed = 5" in capsys.readouterr().out


def test_a_ready_made_instance_given_another_option_exits_2_naming_it(tasks_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["eval", f"{tasks_file}:READY", "--taskset.seed", "1", "--output-dir", str(out)]) == 2
    assert "'seed' = 1 (it has 5)" in capsys.readouterr().err
    assert not out.exists()
