"""verifiers' `vf-eval` flags are translated to tracegym eval's, each named once (issue 34, item 1)."""

import json

import pytest

from tracegym.cli.main import main
from tracegym.config.command_line import read_files
from tracegym.core.errors import UsageError
from tracegym.eval.verifiers_flags import translate


def test_same_value_flags_are_renamed_with_a_note_each():
    args, notes = translate(["reverse-text", "--num-examples", "4", "--rollouts-per-example=3", "-T", "0.5"])
    assert args == ["reverse-text", "--num-tasks", "4", "--rollouts", "3", "--sampling.temperature", "0.5"]
    assert len(notes) == 3 and "--num-tasks" in notes[0]


def test_env_args_become_the_taskset_section_as_inline_json():
    args, _ = translate(["-a", '{"reward": "exact", "lengths": [3, 5]}'])
    files, rest, _ = read_files(args, renames=())
    assert rest == [] and files[0].data == {"taskset": {"reward": "exact", "lengths": [3, 5]}}


def test_sampling_args_outside_our_fields_go_to_sampling_extra():
    args, _ = translate(["-S", '{"temperature": 0.2, "top_k": 20}'])
    assert json.loads(args[2]) == {"temperature": 0.2, "extra": {"top_k": 20}}


def test_save_results_is_dropped_with_a_note():
    args, notes = translate(["-s", "-n", "2"])
    assert args == ["-n", "2"] and "always written" in notes[0]


def test_a_flag_with_no_equivalent_is_named():
    with pytest.raises(UsageError, match="--verbose"):
        translate(["--verbose"])


def test_env_args_that_are_not_an_object_are_named():
    with pytest.raises(UsageError, match="--env-args"):
        translate(["--env-args", "[1, 2]"])


def test_our_own_flags_pass_untouched():
    args = ["reverse-text", "-n", "2", "--sampling.max-tokens", "8", "--no-rich"]
    assert translate(args) == (args, [])


def test_eval_takes_a_vf_eval_command_line(capsys):
    code = main(["eval", "reverse-text", "--num-examples", "3", "--rollouts-per-example", "2", "-a",
                 '{"reward": "exact"}', "-S", '{"top_k": 20}', "-t", "16", "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0 and 'reward = "exact"' in out and "num_tasks = 3" in out and "top_k = 20" in out, out + err
    assert "--num-examples (verifiers) is --num-tasks here" in err
