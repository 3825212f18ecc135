"""RAE's baselines are checkpointed with the run: a resume goes on from them, and resuming with RAE from a
checkpoint that lacks them (a run made with another advantage) is a loud error, not a silent cold start."""

import pytest
from test_rl_resume import make_batch, trainer_loop
from test_trainer import one_thread, tiny_trainer  # noqa: F401 (one_thread is an autouse fixture)

from tracegym.core.errors import UsageError
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import RLFolder
from tracegym.train.roles import orchestrator_for


def config(advantage: dict) -> RLConfig:
    return RLConfig.model_validate({
        "steps": 4, "checkpoint_every": 1, "trainer": {"model": "tiny"},
        "orchestrator": {"advantage": advantage, "tasks_per_step": 3,
                         "train": {"envs": [{"id": "reverse-text"}, {"id": "alphabet-sort"}]}}})


RAE = config({"name": "rae", "alpha": 0.9})


def test_a_resume_goes_on_from_the_checkpointed_rae_baselines(tmp_path, endpoints):
    folder = RLFolder(tmp_path)
    first = orchestrator_for(RAE, folder, endpoints)
    make_batch(first, 0, (1.0, 1.0))  # one key: baseline 0.1 then 0.19, advantages 0.9 and 0.81
    baselines = dict(first.signal.advantages.fn.baselines)
    assert list(baselines.values()) == [pytest.approx(0.19)]
    trainer_loop(folder).step(0, folder.read_batch(0))  # checkpoints step 1 with the orchestrator's state

    resumed = orchestrator_for(RAE, folder, endpoints)
    assert resumed.signal.advantages.fn.baselines == baselines
    assert resumed.signal.advantages([1.0], key=next(iter(baselines))) == pytest.approx([1.0 - 0.271])  # 0.9*0.19+0.1


def test_resuming_with_rae_from_a_checkpoint_without_its_state_is_a_loud_error(tmp_path, endpoints):
    folder = RLFolder(tmp_path)
    first = orchestrator_for(config({"name": "group_mean"}), folder, endpoints)
    make_batch(first, 0, (1.0, 0.0))
    trainer_loop(folder).step(0, folder.read_batch(0))
    with pytest.raises(UsageError, match="no state of the advantage function"):
        orchestrator_for(RAE, folder, endpoints)
