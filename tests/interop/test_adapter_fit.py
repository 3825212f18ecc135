"""What TRL's environment_factory and the OpenEnv server cannot run is refused by name: a group reward (None on every
rollout there) and a program-driven task (their own turn loop never runs it)."""

import pytest

import tracegym as tg
from tracegym.core.errors import UsageError
from tracegym.envs.harness_choice import HarnessChoice
from tracegym.interop.openenv_server import OpenEnvServer
from tracegym.interop.trl import environment_factory


@tg.reward(group=True)
def best_of_group(task, traces):
    return [1.0 for _ in traces]


def grouped() -> tg.Taskset:
    return tg.Taskset(id="grouped", data=[{"prompt": "q"}], rewards=[best_of_group])


def program_driven() -> tg.Taskset:
    plain = tg.Taskset(id="driven", data=[{"prompt": "q"}])
    return plain.with_harness(HarnessChoice(command=["true"]))


def test_trl_refuses_a_group_reward_naming_it():
    with pytest.raises(UsageError, match=r"group reward 'best_of_group'.*TRL's environment_factory"):
        environment_factory(grouped())


def test_trl_refuses_a_program_driven_taskset():
    with pytest.raises(UsageError, match="program harness"):
        environment_factory(program_driven())


def test_the_openenv_server_refuses_a_group_reward_naming_it():
    with pytest.raises(UsageError, match=r"group reward 'best_of_group'.*OpenEnv session"):
        OpenEnvServer(grouped())


def test_the_openenv_server_refuses_a_program_driven_taskset():
    with pytest.raises(UsageError, match="program harness"):
        OpenEnvServer(program_driven())
