"""The trainer's thread count beside the run's CPU vLLM: half the cores unless the config says otherwise."""

import os

import pytest

from tracegym.train import launcher
from tracegym.train.rl_config import parse_rl_args

SHIPPED = "configs/rl/reverse_text.toml"


def config(*flags: str):
    return parse_rl_args(["@", SHIPPED, *flags])[0]


@pytest.fixture
def cpu_build(monkeypatch):
    """As on the CPU build of vLLM (what this machine has; the rule is for it alone)."""
    monkeypatch.setattr(launcher, "is_cpu_build", lambda: True)


def test_a_cpu_trainer_beside_its_own_vllm_takes_half_the_cores(cpu_build):
    threads = launcher.with_cpu_threads(config().trainer).num_threads
    assert threads == max(1, (os.cpu_count() or 2) // 2)


def test_threads_the_config_sets_are_kept(cpu_build):
    assert launcher.with_cpu_threads(config("--trainer.num-threads", "3").trainer).num_threads == 3


def test_a_gpu_trainer_is_left_alone(cpu_build):
    assert launcher.with_cpu_threads(config("--trainer.device", "cuda").trainer).num_threads is None
