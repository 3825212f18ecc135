"""How the launcher starts the trainer role (alone, or as N ranks under torchrun), and the world sizes it refuses."""

import sys
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.train.launch_plan import plan_launch
from tracegym.train.rl_config import parse_rl_args

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "rl" / "reverse_text.toml"


def trainer_command(*flags: str) -> list[str]:
    plan = plan_launch(parse_rl_args(["@", str(SHIPPED), *flags])[0], Path("/run"))
    return plan.trainer.command(plan.run_dir)


def test_one_trainer_process_is_the_role_itself():
    assert trainer_command() == [sys.executable, "-m", "tracegym.train.roles", "trainer", "/run"]


def test_several_trainer_processes_start_under_torchrun_on_this_machine():
    assert trainer_command("--trainer.num-processes", "4") == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
        "-m", "tracegym.train.roles", "trainer", "/run"]


@pytest.mark.parametrize(("processes", "says"), [
    ("0", "--trainer.num-processes: Input should be greater than or equal to 1"),
    ("64", "--trainer.num-processes: 64 trainer ranks, but a step has only 32 rollouts"),
])
def test_a_world_size_a_step_cannot_fill_is_a_usage_error(processes, says, capsys):
    assert main(["rl", "@", str(SHIPPED), "--trainer.num-processes", processes, "--dry-run"]) == 2
    assert says in capsys.readouterr().err
