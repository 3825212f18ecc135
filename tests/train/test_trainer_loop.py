"""The trainer process's loop on a tiny model: waits for batches, publishes each version, checkpoints, resumes."""

from test_trainer import one_thread, samples, tiny_trainer  # noqa: F401 (one_thread is an autouse fixture)

from tracegym.train import exchange
from tracegym.train.rl_config import RLConfig
from tracegym.train.trainer_loop import latest_checkpoint, train


class Publisher:
    """Records what the loop asked vLLM to serve."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, path, version: int) -> str:
        assert (path / "adapter_config.json").is_file()
        self.calls.append(version)
        return "policy"


def config(steps: int, every: int = 2) -> RLConfig:
    return RLConfig.model_validate({"steps": steps, "checkpoint_every": every, "trainer": {"model": "tiny"}})


def write_batches(run_dir, steps: range) -> None:
    for step in steps:
        exchange.write_batch(run_dir, step, samples(step), {"generation_s": 0.1})


def test_every_step_publishes_the_next_policy_version(tmp_path):
    write_batches(tmp_path, range(3))
    publish = Publisher()
    train(config(3), tmp_path, tiny_trainer(), publish)
    assert publish.calls == [1, 2, 3]
    assert exchange.current_policy(tmp_path, "base") == (3, "policy")


def test_checkpoints_are_written_every_n_steps_and_after_the_last(tmp_path):
    write_batches(tmp_path, range(3))
    train(config(3, every=2), tmp_path, tiny_trainer(), Publisher())
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-000002", "step-000003"]


def test_a_resumed_trainer_starts_after_its_newest_checkpoint(tmp_path):
    write_batches(tmp_path, range(2))
    train(config(2, every=2), tmp_path, tiny_trainer(), Publisher())
    write_batches(tmp_path, range(2, 4))
    publish = Publisher()
    trainer = tiny_trainer()
    train(config(4, every=2), tmp_path, trainer, publish)
    assert publish.calls == [2, 3, 4]  # the checkpoint's version is served again first, then two new steps
    assert latest_checkpoint(tmp_path).name == "step-000004"


def test_an_empty_batch_still_advances_the_version(tmp_path):
    exchange.write_batch(tmp_path, 0, [], {})
    publish = Publisher()
    train(config(1), tmp_path, tiny_trainer(), publish)
    assert publish.calls == [1]
