"""The vLLM plugin: it changes vLLM's message-queue readers only where the server's environment asks. (vLLM's own
constructor is stood in for here; `test_vllm_server` checks the plugin inside a real engine core.)"""

import pytest

from tracegym.models import vllm_plugin

shm_broadcast = pytest.importorskip("vllm.distributed.device_communicators.shm_broadcast")


@pytest.fixture
def reader_spin(monkeypatch: pytest.MonkeyPatch):
    """Makes a queue reader the way vLLM does (keywords, no spin given) and answers the spin its constructor got."""
    got = []

    def vllm_init(self, is_reader, context, notify_address, busy_loop_s=1):
        got.append(busy_loop_s)

    monkeypatch.setattr(shm_broadcast.SpinCondition, "__init__", vllm_init)
    monkeypatch.setattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS", shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS)

    def make() -> float:
        shm_broadcast.SpinCondition(is_reader=True, context=None, notify_address="ipc://unused")
        return got[-1]

    return make


def test_the_environments_spin_reaches_every_reader_made_after_registration(reader_spin, monkeypatch):
    monkeypatch.setenv(vllm_plugin.QUEUE_SPIN_ENV, "0.0")
    vllm_plugin.register()
    assert reader_spin() == 0.0


def test_setting_it_again_replaces_the_setting_rather_than_stacking(reader_spin):
    vllm_plugin.set_queue_spin(0.5)
    vllm_plugin.set_queue_spin(0.25)
    assert reader_spin() == 0.25


def test_without_the_environment_vllm_keeps_its_own_spin(reader_spin, monkeypatch):
    monkeypatch.delenv(vllm_plugin.QUEUE_SPIN_ENV, raising=False)
    vllm_plugin.register()
    assert reader_spin() == 1


def test_a_reader_that_sleeps_rechecks_often_enough_to_bound_a_lost_notification(reader_spin):
    vllm_plugin.set_queue_spin(0.0)
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == vllm_plugin.RECHECK_MS <= 10
