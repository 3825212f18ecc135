"""`tracegym eval|serve verifiers:MODULE`: a run in process (`--no-serve`); a module that cannot be loaded is one
line naming its file, exit 2, before any rollout and with nothing written."""

import json

import pytest
from verifiers_envs import SINGLE_TURN

from tracegym.cli.main import main
from tracegym.testing import FakeOpenAIServer

pytest.importorskip("verifiers")

BAD_MODULES = {
    "no_loader.py": ("X = 1\n", "verifiers environment 'FILE' has no load_environment() function"),
    "raises.py": ("import verifiers\nraise RuntimeError('boom')\n",
                  "verifiers environment file 'FILE' failed to import: RuntimeError: boom"),
    "syntax.py": ("def load_environment(:\n", "verifiers environment file 'FILE' failed to import: syntax error"),
    "not_an_env.py": ("def load_environment():\n    return 42\n",
                      "verifiers environment 'FILE': load_environment() returned int 42, not a verifiers Environment"),
}


def test_eval_in_process_records_the_rubrics_rewards(tmp_path, capsys):
    path = tmp_path / "words.py"
    path.write_text(SINGLE_TURN)
    with FakeOpenAIServer(rule=lambda request: request.messages[-1].text.split()[-1]) as server:
        code = main(["eval", f"verifiers:{path}", "-r", "1", "--no-serve", "--taskset.env-args", '{"words": ["fig"]}',
                     "--model.base-url", server.base_url, "--output-dir", str(tmp_path / "out"), "--no-rich"])
    assert code == 0, capsys.readouterr().err
    [summary] = (tmp_path / "out").rglob("summary.json")
    figures = json.loads(summary.read_text())
    assert (figures["num_scored"], figures["reward"]) == (1, 1.0)
    assert figures["metrics"]["length"]["mean"] == 3.0


@pytest.mark.parametrize("command", ["eval", "serve"])
@pytest.mark.parametrize("name", sorted(BAD_MODULES))
def test_a_module_that_cannot_be_loaded_exits_2_with_one_line_naming_its_file(command, name, tmp_path, capsys):
    source, said = BAD_MODULES[name]
    path = tmp_path / name
    path.write_text(source)
    out = tmp_path / "out"
    flags = ["--output-dir", str(out)] if command == "eval" else []
    assert main([command, f"verifiers:{path}", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"tracegym {command}: ") and said.replace("FILE", str(path)) in err
    assert "\n" not in err and not out.exists()


def test_an_id_without_a_module_exits_2_saying_what_it_takes(capsys):
    assert main(["eval", "verifiers:"]) == 2
    assert "verifiers: takes a module" in capsys.readouterr().err
