"""The trainer process's loop on a tiny model: waits for batches, publishes each version, checkpoints, resumes."""

import pytest
from test_trainer import one_thread, samples, tiny_trainer  # noqa: F401 (one_thread is an autouse fixture)

from tracegym.core.errors import UsageError
from tracegym.train.rl_folder import ORCHESTRATOR_STATE, RLFolder, orchestrator_state
from tracegym.train.trainer_loop import TrainerLoop


class Publisher:
    """Records what the loop asked vLLM to serve."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, path, version: int) -> str:
        assert (path / "adapter_config.json").is_file()
        self.calls.append(version)
        return "policy"


def loop(tmp_path, steps: int, every: int = 2, trainer=None, publish=None) -> TrainerLoop:
    return TrainerLoop(RLFolder(tmp_path), trainer or tiny_trainer(), publish or Publisher(), steps=steps,
                       checkpoint_every=every)


def write_batches(run_dir, steps: range) -> None:
    for step in steps:
        RLFolder(run_dir).write_batch(step, samples(step), {"generation_s": 0.1}, state={"next_step": step + 1})


def test_every_step_publishes_the_next_policy_version(tmp_path):
    write_batches(tmp_path, range(3))
    publish = Publisher()
    loop(tmp_path, 3, publish=publish).run()
    assert publish.calls == [1, 2, 3]
    assert RLFolder(tmp_path).policy("base") == (3, "policy")


def test_checkpoints_are_written_every_n_steps_and_after_the_last(tmp_path):
    write_batches(tmp_path, range(3))
    loop(tmp_path, 3, every=2).run()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-000002", "step-000003"]


def test_a_resumed_trainer_starts_after_its_newest_checkpoint(tmp_path):
    write_batches(tmp_path, range(2))
    loop(tmp_path, 2, every=2).run()
    write_batches(tmp_path, range(2, 4))
    publish = Publisher()
    loop(tmp_path, 4, every=2, publish=publish).run()
    assert publish.calls == [2, 3, 4]  # the checkpoint's version is served again first, then two new steps
    assert RLFolder(tmp_path).latest_checkpoint().name == "step-000004"


def test_an_empty_batch_still_advances_the_version(tmp_path):
    RLFolder(tmp_path).write_batch(0, [], {})
    publish = Publisher()
    loop(tmp_path, 1, publish=publish).run()
    assert publish.calls == [1]


def test_a_checkpoint_holds_the_orchestrator_state_of_the_last_batch_it_trained(tmp_path):
    """The state came with batch 2 (what a resume from step 3 needs), not with a batch made ahead of it."""
    write_batches(tmp_path, range(4))
    loop(tmp_path, 3, every=3).run()
    assert orchestrator_state(RLFolder(tmp_path).latest_checkpoint()) == {"next_step": 3}


def test_a_checkpoint_without_orchestrator_state_cannot_resume_an_orchestrator(tmp_path):
    path = tiny_trainer().save(tmp_path / "ckpt", extra_state={ORCHESTRATOR_STATE: {}})
    with pytest.raises(UsageError, match="no orchestrator state"):
        orchestrator_state(path)
