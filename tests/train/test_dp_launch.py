"""How the launcher starts the trainer role: alone, or as N ranks under torchrun."""

import sys
from pathlib import Path

from tracegym.train.launcher import role_command


def test_one_trainer_process_is_the_role_itself():
    assert role_command("trainer", Path("/run")) == [sys.executable, "-m", "tracegym.train.roles", "trainer", "/run"]


def test_several_trainer_processes_start_under_torchrun_on_this_machine():
    assert role_command("trainer", Path("/run"), 4) == [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
        "-m", "tracegym.train.roles", "trainer", "/run"]
