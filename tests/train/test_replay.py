"""A stored RL step trained again gives the run's weights bit for bit, or names the first tensor that differs
(issue 37, part 3)."""

import pytest
from test_trainer import one_thread, samples, tiny_trainer  # noqa: F401 (one_thread is an autouse fixture)
from test_trainer_loop import Publisher, write_batches

from tracegym.cli.main import main
from tracegym.core.errors import UsageError
from tracegym.train.replay import replay
from tracegym.train.rl_folder import RLFolder
from tracegym.train.trainer_loop import TrainerLoop


def _run(tmp_path, steps: int = 3, every: int = 2) -> None:
    write_batches(tmp_path, range(steps))
    TrainerLoop(RLFolder(tmp_path), tiny_trainer(), Publisher(), steps=steps, checkpoint_every=every).run()


def _replay(tmp_path, step: int):
    return replay(tmp_path, step, tiny_trainer().config, lambda _config: tiny_trainer())


def test_every_trained_step_records_its_weight_digest(tmp_path):
    _run(tmp_path)
    records = RLFolder(tmp_path).trainer_metrics.read()
    assert [len(r["weights_digest"]) for r in records] == [32, 32, 32]
    assert all(RLFolder(tmp_path).digest_path(s).is_file() for s in range(3))


def test_a_step_replayed_from_the_start_equals_the_run_bit_for_bit(tmp_path):
    _run(tmp_path)
    result = _replay(tmp_path, 1)
    assert result.equal and result.start == 0, result.line()


def test_a_step_after_a_checkpoint_is_replayed_from_that_checkpoint(tmp_path):
    _run(tmp_path)
    result = _replay(tmp_path, 2)
    assert result.equal and result.start == 2, result.line()


def test_a_changed_batch_is_found_at_its_step_naming_the_first_tensor(tmp_path):
    _run(tmp_path)
    RLFolder(tmp_path).write_batch(1, samples(99), {}, state={"next_step": 2})
    result = _replay(tmp_path, 1)
    assert result.diverged_at == 1 and "lora" in (result.first_tensor or "")
    assert "step 1 differs first, at tensor" in result.line()


def test_a_step_without_a_digest_is_named(tmp_path):
    _run(tmp_path, steps=1, every=1)
    with pytest.raises(UsageError, match="step 5 has no weight digest"):
        _replay(tmp_path, 5)


def test_replay_of_a_folder_that_is_not_a_run_is_one_line(tmp_path, capsys):
    assert main(["rl", "--replay", str(tmp_path), "--step", "0"]) == 2
    assert "is not an RL run folder" in capsys.readouterr().err


def test_replay_without_a_step_says_how(tmp_path, capsys):
    assert main(["rl", "--replay", str(tmp_path)]) == 2
    assert "--step K" in capsys.readouterr().err
