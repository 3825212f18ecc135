"""A resumed RL run restores the trainer and the orchestrator from one checkpoint: the orchestrator's state
(advantage baselines, counts, task draw) reaches the trainer process with each batch and is saved with the
trainer's checkpoint; a resume goes on exactly as the run would have, keeping the batches the orchestrator made
ahead."""

from test_orchestrator_failures import to_samples, tokened
from test_trainer import one_thread, tiny_trainer  # noqa: F401 (one_thread is an autouse fixture)

from tracegym.train.orchestrator import Orchestrator
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import RLFolder
from tracegym.train.roles import orchestrator_for
from tracegym.train.trainer_loop import TrainerLoop

CONFIG = RLConfig.model_validate({
    "steps": 4, "checkpoint_every": 1, "trainer": {"model": "tiny"},
    "orchestrator": {"advantage": "tracegym.train.advantages:EMABaseline", "tasks_per_step": 3,
                     "train": {"envs": [{"id": "reverse-text"}, {"id": "alphabet-sort"}]}}})


def make_batch(orchestrator: Orchestrator, step: int, rewards: tuple[float, float]) -> list[tuple[str, str]]:
    """What a step does to the orchestrator's state, without env servers: draw the tasks, score one group, hand
    the batch over. Returns the drawn (env, task key) pairs."""
    drawn = [(env.id, data.key) for env, data in orchestrator.draw()]
    samples = to_samples(orchestrator, [[tokened(r) for r in rewards]], version=step, step=step)
    orchestrator.hand_over(step, samples, {"generation_s": 0.1})
    return drawn


def trainer_loop(folder: RLFolder) -> TrainerLoop:
    return TrainerLoop(folder, tiny_trainer(), lambda path, version: "policy", steps=4, checkpoint_every=1)


def test_a_resume_restores_the_trainer_and_the_orchestrator_from_one_checkpoint(tmp_path, endpoints):
    folder = RLFolder(tmp_path)
    first = orchestrator_for(CONFIG, folder, endpoints)
    make_batch(first, 0, (1.0, 0.0))
    after_step_0 = first.state_dict()
    trainer_loop(folder).step(0, folder.read_batch(0))  # trains step 0, checkpoints step 1
    (folder.path / "batches" / "step-000000.msgpack").unlink()  # only the checkpoint holds the state now

    assert folder.rewind() == 1
    resumed = orchestrator_for(CONFIG, folder, endpoints)
    trainer = trainer_loop(folder)
    assert trainer.resume() == resumed.next_step == 1 and trainer.trainer.version == 1
    assert resumed.state_dict() == after_step_0
    assert resumed.signal.advantages.fn.baselines == {tokened(1.0).task_key: 0.5}  # the EMA baseline came back


def test_a_batch_made_ahead_of_the_checkpoint_is_kept_and_the_orchestrator_goes_on_after_it(tmp_path, endpoints):
    folder = RLFolder(tmp_path)
    first = orchestrator_for(CONFIG, folder, endpoints)
    make_batch(first, 0, (1.0, 0.0))
    trainer_loop(folder).step(0, folder.read_batch(0))  # trains step 0, checkpoints step 1
    make_batch(first, 1, (0.0, 0.0))  # made ahead of the trainer, then the run is killed
    after_step_1 = first.state_dict()
    expected = make_batch(first, 2, (1.0, 1.0))
    (folder.path / "batches" / "step-000002.msgpack").unlink()  # killed while making step 2, before its batch

    assert folder.rewind() == 1 and folder.read_batch(1) is not None
    resumed = orchestrator_for(CONFIG, folder, endpoints)
    assert trainer_loop(folder).resume() == 1 and resumed.next_step == 2  # the trainer trains batch 1 as made
    assert resumed.state_dict() == after_step_1
    assert make_batch(resumed, 2, (1.0, 1.0)) == expected  # the same tasks as the run that was killed drew


def test_a_fresh_run_starts_at_step_0_with_fresh_state(tmp_path, endpoints):
    orchestrator = orchestrator_for(CONFIG, RLFolder(tmp_path), endpoints)
    assert orchestrator.next_step == 0 and orchestrator.signal.advantages.fn.baselines == {}
