"""The `tracegym` dispatcher: usage, unknown commands, errors as one line with an exit code."""

import pytest

from tracegym.cli.main import main


def test_no_command_prints_usage_and_exits_2(capsys):
    assert main([]) == 2
    assert "inference" in capsys.readouterr().out


def test_an_unknown_command_is_named(capsys):
    assert main(["evaluate-everything"]) == 2
    assert "unknown command 'evaluate-everything'" in capsys.readouterr().err


def test_inference_help_lists_its_options(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["inference", "--help", "--plain"])
    assert exit_.value.code == 0
    assert "--model.max-model-len" in capsys.readouterr().out


def test_resume_without_a_folder_says_it_needs_one(capsys):
    assert main(["eval", "--resume", "--help"]) == 2
    assert "--resume needs a value" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["show", "rescore", "plot", "list"])
def test_help_of_a_positional_command_prints_its_usage_and_exits_0(command, capsys):
    assert main([command, "--help"]) == 0
    assert f"tracegym {command}" in capsys.readouterr().out
