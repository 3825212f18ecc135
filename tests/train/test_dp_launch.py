"""How the launcher starts the trainer role (alone, or as N ranks under torchrun), and the world sizes it refuses."""

import sys
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.train.launcher import role_command

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "rl" / "reverse_text.toml"


def test_one_trainer_process_is_the_role_itself():
    assert role_command("trainer", Path("/run")) == [sys.executable, "-m", "tracegym.train.roles", "trainer", "/run"]


def test_several_trainer_processes_start_under_torchrun_on_this_machine():
    assert role_command("trainer", Path("/run"), 4) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
        "-m", "tracegym.train.roles", "trainer", "/run"]


@pytest.mark.parametrize(("processes", "says"), [
    ("0", "--trainer.num-processes: Input should be greater than or equal to 1"),
    ("64", "--trainer.num-processes: 64 trainer ranks, but a step has only 32 rollouts"),
])
def test_a_world_size_a_step_cannot_fill_is_a_usage_error(processes, says, capsys):
    assert main(["rl", "@", str(SHIPPED), "--trainer.num-processes", processes, "--dry-run"]) == 2
    assert says in capsys.readouterr().err
