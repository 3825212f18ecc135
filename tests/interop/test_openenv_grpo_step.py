"""A real TRL `GRPOTrainer` step on the embedded SmolLM2 (CPU) with an OpenEnv server's environment through
`environment_factory(OpenEnvTaskset(...))`: TRL sees the server's tools, and every rollout of the batch holds one
session, all given back."""

import pytest
from openenv_reference import echo_server
from test_trl_grpo_step import grpo_step

from tracegym.interop.openenv_taskset import OpenEnvTaskset

pytestmark = pytest.mark.slow


def test_one_grpo_step_on_an_openenv_server_offers_its_tools_within_its_capacity(tmp_path):
    outputs = {}
    with echo_server(max_concurrent_envs=2) as url:  # the batch: one prompt, two generations, two sessions
        taskset = OpenEnvTaskset({"url": url, "num_tasks": 1, "retries": 0, "capacity_wait": 0})
        trainer, logged, _ = grpo_step(tmp_path, taskset, prompts=1, outputs=outputs)
        held = taskset._server.held
    assert [tool.__name__ for tool in trainer._env_tools[None]] == ["echo_message"]
    assert len(outputs["env_reward"]) == 2 and all(r is not None and r >= 0 for r in outputs["env_reward"])
    assert [env._trace.rewards["env_reward"].score for env in trainer.environments] == outputs["env_reward"]
    assert held == 0 and "rewards/env_reward/mean" in logged
