"""Online difficulty: tasks outside the pass-rate band are drawn less (and re-checked now and then), groups without
signal are refilled up to a bound so a step keeps its batch size, and the state goes through a resume (a resume
that lacks it while it is on is a loud error)."""

import asyncio
import itertools
from collections import Counter

import pytest
from test_orchestrator import alternating_per_prompt, env_addresses, make  # noqa: F401 (env_addresses: a fixture)
from test_orchestrator_failures import to_samples, tokened
from test_rl_resume import trainer_loop
from test_trainer import one_thread, tiny_trainer  # noqa: F401 (one_thread is an autouse fixture)

from tracegym.core.episode import Episode
from tracegym.core.errors import UsageError
from tracegym.core.task_data import TaskData
from tracegym.testing import FakeOpenAIServer, make_episode
from tracegym.train.difficulty import DifficultyConfig, OnlineDifficulty, TaskDifficulty
from tracegym.train.orchestrator import group_key, group_passes, group_rewards
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import RLFolder
from tracegym.train.roles import orchestrator_for


def rows(keys) -> "itertools.cycle[TaskData]":
    return itertools.cycle([TaskData(prompt=f"task {k}", id=str(k)) for k in keys])


def known(config: DifficultyConfig | None = None, seed: int = 0) -> TaskDifficulty:
    """Ten tasks seen once: 0-4 always passed (too easy), 5-6 never (too hard), 7-9 half the time (in band)."""
    difficulty = TaskDifficulty(config or DifficultyConfig(), seed)
    for key in range(10):
        difficulty.observe(str(key), [1.0] * 4 if key < 5 else [0.0] * 4 if key < 7 else [1.0, 0.0, 1.0, 0.0])
    return difficulty


def test_a_task_is_judged_by_the_mean_reward_of_its_last_groups():
    difficulty = TaskDifficulty(DifficultyConfig(low=0.2, high=0.8, window=2), seed=0)
    assert difficulty.verdict("t") == "unseen"
    difficulty.observe("t", [1.0, 1.0])
    assert difficulty.verdict("t") == "too_easy"
    difficulty.observe("t", [0.0, 1.0])  # (1.0 + 0.5) / 2 = 0.75
    assert difficulty.verdict("t") == "in_band"
    difficulty.observe("t", [0.0, 0.0])  # the first group left the window: (0.5 + 0.0) / 2
    assert difficulty.verdict("t") == "in_band"
    difficulty.observe("t", [0.0, 0.0])
    assert difficulty.verdict("t") == "too_hard"
    difficulty.observe("u", [])  # no trainable rollout: nothing learnt
    assert difficulty.verdict("u") == "unseen"


def test_in_band_and_unseen_tasks_are_always_drawn_and_out_of_band_ones_about_weight_times_as_often():
    difficulty = known(DifficultyConfig(out_of_band_weight=0.1), seed=3)
    stream = rows(range(12))  # 10 and 11 are unseen
    drawn = Counter(difficulty.draw(stream.__next__).key for _ in range(3000))
    always = [drawn[k] for k in ("7", "8", "9", "10", "11")]  # in band or unseen: drawn whenever the stream came
    passes = max(always)
    assert passes - min(always) <= 1  # (the last pass may be cut short)
    for key in map(str, range(7)):  # out of band: drawn ~10% of the times the stream came to it
        assert 0.05 * passes < drawn[key] < 0.2 * passes
    skipped = difficulty.metrics()["skipped"]
    assert abs(3000 + skipped - 12 * passes) <= 12  # every row the stream came to was drawn or passed over


def test_the_same_seed_draws_the_same_tasks():
    def draws(seed):
        difficulty, stream = known(seed=seed), rows(range(10))
        return [difficulty.draw(stream.__next__).key for _ in range(200)]

    assert draws(1) == draws(1) != draws(2)


def test_an_out_of_band_task_that_is_rechecked_and_now_in_band_comes_back():
    difficulty = known(DifficultyConfig(window=1, out_of_band_weight=1e-9))
    assert difficulty.draw(rows(["0", "7"]).__next__).key == "7"  # "0" is too easy: passed over
    difficulty.observe("0", [1.0, 0.0])  # a re-check found it in the band again
    assert difficulty.draw(rows(["0", "7"]).__next__).key == "0"


def test_an_environment_whose_every_task_is_out_of_band_is_still_drawn_from():
    difficulty = known(DifficultyConfig(out_of_band_weight=1e-9, max_skips=5))
    stream = rows(range(5))  # all too easy
    assert difficulty.draw(stream.__next__).key == "0"  # five passed over, the sixth taken
    assert difficulty.metrics()["skipped"] == 5


def test_an_endless_stream_is_judged_by_what_was_seen_and_the_state_stays_bounded():
    difficulty = TaskDifficulty(DifficultyConfig(out_of_band_weight=1e-9, capacity=100), seed=0)
    endless = (TaskData(prompt="x", id=f"new-{i}") for i in itertools.count())
    keys = [difficulty.draw(endless.__next__).key for _ in range(500)]
    assert keys == [f"new-{i}" for i in range(500)]  # nothing seen yet: nothing passed over
    for key in keys:
        difficulty.observe(key, [1.0])
    assert len(difficulty.rates) == 100 and "new-499" in difficulty.rates and "new-0" not in difficulty.rates
    repeats = itertools.cycle([TaskData(prompt="x", id="new-499"), TaskData(prompt="y", id="fresh")])
    assert difficulty.draw(repeats.__next__).key == "fresh"


def test_a_game_task_is_judged_per_seat_so_a_zero_sum_split_is_in_band_not_too_hard():
    difficulty = TaskDifficulty(DifficultyConfig(), seed=0)
    difficulty.observe("split", {"player_0": [1.0, 0.0], "player_1": [0.0, 1.0]})  # payoffs would average 0
    difficulty.observe("one-sided", {"player_0": [1.0, 1.0], "player_1": [0.0, 1.0]})
    assert (difficulty.verdict("split"), difficulty.verdict("one-sided")) == ("in_band", "in_band")


def test_a_game_task_every_seat_of_which_always_wins_or_always_loses_is_decided():
    difficulty = TaskDifficulty(DifficultyConfig(), seed=0)
    difficulty.observe("k-vs-j", {"player_0": [1.0, 1.0], "player_1": [0.0, 0.0]})
    difficulty.observe("lost-by-all", {"player_0": [0.0], "player_1": [0.0]})
    assert (difficulty.verdict("k-vs-j"), difficulty.verdict("lost-by-all")) == ("decided", "too_hard")
    assert difficulty.metrics()["decided"] == 1


def test_a_checkpoint_of_per_task_rates_loads_as_one_seat():
    difficulty = TaskDifficulty(DifficultyConfig(), seed=0)
    state = difficulty.state_dict() | {"rates": [["t", [1.0, 1.0]]]}
    difficulty.load_state_dict(state)
    assert difficulty.verdict("t") == "too_easy" and TaskDifficulty(DifficultyConfig(), 0).verdict("t") == "unseen"


def self_play(winners: list[str], key: str = "deal") -> list[Episode]:
    """A self-play group of kuhn-poker episodes, both seats trained, won by `winners` in turn."""
    data = TaskData(prompt="deal", id=key)
    return [make_episode({seat: 1.0 if seat == winner else -1.0 for seat in ("player_0", "player_1")}, task=data)
            for winner in winners]


def orchestrators_difficulty() -> OnlineDifficulty[list[Episode]]:
    return OnlineDifficulty({"kuhn": TaskDifficulty(DifficultyConfig(refills=2), seed=0)}, group_rewards,
                            group_key, group_passes)


def test_a_self_play_group_one_seat_of_which_always_wins_has_no_signal_and_its_deal_is_decided():
    difficulty = orchestrators_difficulty()
    decided = self_play(["player_0"] * 4)  # rewards +1 and -1 in every episode: no seat compares differently
    assert group_rewards(decided) == {"player_0": [1.0] * 4, "player_1": [-1.0] * 4}
    assert not difficulty.signal(decided)
    difficulty.observe([("kuhn", decided)])
    assert difficulty.envs["kuhn"].verdict("deal") == "decided"


def test_a_self_play_group_whose_winner_varies_has_signal_and_its_deal_is_in_band():
    difficulty = orchestrators_difficulty()
    split = self_play(["player_0", "player_1", "player_0", "player_0"])
    assert difficulty.signal(split)
    difficulty.observe([("kuhn", split)])
    assert difficulty.envs["kuhn"].rates["deal"] == {"player_0": [0.75], "player_1": [0.25]}
    assert difficulty.envs["kuhn"].verdict("deal") == "in_band"


def test_a_learner_seat_is_judged_by_its_own_wins_not_by_the_opponents():
    data = TaskData(prompt="deal", id="d")
    group = [make_episode({"player_0": 1.0, "player_1": -1.0}, task=data, trainable={"player_0": True,
                                                                                      "player_1": False}),
             make_episode({"player_0": -1.0, "player_1": 1.0}, task=data, trainable={"player_0": False,
                                                                                      "player_1": True})]
    assert group_passes(group) == {"player_0": [1.0], "player_1": [1.0]}  # the learner won as each seat


# --- refills ------------------------------------------------------------------------------------------------------
Group = tuple[str, list[float]]
"""A fake group: its task key and its rewards."""


def online(**configs: DifficultyConfig) -> OnlineDifficulty[Group]:
    return OnlineDifficulty({env: TaskDifficulty(c, seed=0) for env, c in configs.items()},
                            rewards=lambda g: g[1], key=lambda g: g[0])


def scripted_runs(results: dict[str, list[list[float]]]):
    """`run(env_ids)`: the next scripted rewards of each environment, as a group of a new task; records calls."""
    left = {env: iter(groups) for env, groups in results.items()}
    calls: list[list[str]] = []
    counter = itertools.count()

    async def run(env_ids: list[str]) -> list[Group]:
        calls.append(env_ids)
        return [(f"{env}-{next(counter)}", next(left[env])) for env in env_ids]

    return run, calls


def test_groups_without_signal_are_refilled_until_the_step_has_its_batch_size():
    difficulty = online(a=DifficultyConfig(refills=5))
    run, calls = scripted_runs({"a": [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]})
    first = [("x", [1.0, 0.0]), ("y", [1.0, 1.0]), ("z", [0.0, 0.0])]  # one with signal, two without
    groups, env_ids = asyncio.run(difficulty.complete(first, ["a", "a", "a"], 3, run))
    assert env_ids == ["a"] * 7
    assert calls == [["a", "a"], ["a"], ["a"]]  # both replaced; then one more is wanted, and is replaced once more
    assert sum(difficulty.signal(g) for g in groups) == 3 and len(groups) == 7
    assert difficulty.metrics() == {"difficulty/a/in_band": 3, "difficulty/a/too_easy": 2,
                                    "difficulty/a/too_hard": 2, "difficulty/a/decided": 0, "difficulty/a/skipped": 0,
                                    "difficulty/a/refills": 4, "difficulty/a/no_signal": 4}
    assert difficulty.metrics()["difficulty/a/refills"] == 0  # the counts are per step


def test_refills_stop_at_their_bound_and_only_environments_that_have_them_refill():
    difficulty = online(a=DifficultyConfig(refills=1), b=DifficultyConfig())
    run, calls = scripted_runs({"a": [[1.0, 1.0]] * 5})
    first = [("x", [1.0, 1.0]), ("y", [1.0, 1.0]), ("z", [0.0, 0.0])]
    groups, env_ids = asyncio.run(difficulty.complete(first, ["a", "a", "b"], 3, run))
    assert calls == [["a"]]  # one refill of `a`; `b` has none; the step goes on short
    assert len(groups) == 4 and env_ids == ["a", "a", "b", "a"]
    metrics = difficulty.metrics()
    assert metrics["difficulty/a/refills"] == 1 and metrics["difficulty/b/refills"] == 0
    assert metrics["difficulty/a/no_signal"] == 3 and metrics["difficulty/b/no_signal"] == 1


def test_without_online_difficulty_the_step_is_left_as_it_was():
    difficulty = online()
    run, calls = scripted_runs({})
    assert asyncio.run(difficulty.complete([("x", [1.0, 1.0])], ["a"], 2, run)) == ([("x", [1.0, 1.0])], ["a"])
    assert calls == [] and difficulty.metrics() == {}


def test_a_step_through_real_env_servers_keeps_its_batch_size_with_refills(tmp_path, env_addresses):  # noqa: F811
    """The first two tasks always get the same answer (no signal); the refills get two right and two wrong."""
    alternating = alternating_per_prompt()
    first_prompts: list[str] = []

    def rule(request):
        text = request.messages[-1].text
        if text not in first_prompts and len(first_prompts) < 2:
            first_prompts.append(text)
        return "same answer" if text in first_prompts else alternating(request)

    with FakeOpenAIServer(rule=rule) as server:
        orchestrator = make(tmp_path, server, env_addresses,
                            train={"envs": [{"id": "reverse-text", "options": {"seed": 0},
                                             "difficulty": {"refills": 4}}]})

        async def step():
            try:
                return await orchestrator.collect(0, 0, orchestrator.endpoint.model)
            finally:
                await orchestrator.aclose()

        samples, metrics = asyncio.run(step())
    assert metrics["difficulty/reverse-text/refills"] == 2 and metrics["difficulty/reverse-text/no_signal"] == 2
    assert metrics["rollouts"] == 16 and len(samples) == 8  # two groups with signal, as tasks_per_step asks
    assert all(s.advantage != 0 for s in samples) and abs(sum(s.advantage for s in samples)) < 1e-9
    assert len((tmp_path / "traces" / "step-000000.jsonl").read_text().splitlines()) == 16


# --- state across a resume ----------------------------------------------------------------------------------------
def config(difficulty: dict | None) -> RLConfig:
    env = {"id": "reverse-text"} | ({"difficulty": difficulty} if difficulty is not None else {})
    return RLConfig.model_validate({"steps": 4, "checkpoint_every": 1, "trainer": {"model": "tiny"},
                                    "orchestrator": {"tasks_per_step": 4, "train": {"envs": [env]}}})


DIFFICULTY = config({"window": 1, "out_of_band_weight": 0.01})


def one_step(orchestrator, step: int) -> list[str]:
    """What a step does to the difficulty state, without env servers: draw, score (the first task drawn passes
    every rollout, the others half), hand over. Returns the drawn task keys."""
    keys = [data.key for _, data in orchestrator.draw()]
    groups = [[tokened(1.0 if i == 0 else float(r), task_key=k) for r in (0, 1)] for i, k in enumerate(keys)]
    episodes = [[Episode.solo(t) for t in group] for group in groups]
    asyncio.run(orchestrator.difficulty.complete(episodes, ["reverse-text"] * len(keys), 4, None))
    orchestrator.hand_over(step, to_samples(orchestrator, groups, version=step, step=step), {"generation_s": 0.1})
    return keys


def test_a_resume_goes_on_from_the_checkpointed_pass_rates_and_draws_the_same(tmp_path, endpoints):
    folder = RLFolder(tmp_path)
    first = orchestrator_for(DIFFICULTY, folder, endpoints)
    [easy, *_] = one_step(first, 0)
    trainer_loop(folder).step(0, folder.read_batch(0))  # checkpoints step 1 with the orchestrator's state
    rates = dict(first.difficulty.envs["reverse-text"].rates)
    assert first.difficulty.envs["reverse-text"].verdict(easy) == "too_easy"
    expected = one_step(first, 1)
    (folder.path / "batches" / "step-000001.msgpack").unlink()  # killed while making step 1, before its batch

    resumed = orchestrator_for(DIFFICULTY, folder, endpoints)
    assert dict(resumed.difficulty.envs["reverse-text"].rates) == rates
    assert one_step(resumed, 1) == expected


def test_resuming_with_online_difficulty_from_a_checkpoint_without_its_state_is_a_loud_error(tmp_path, endpoints):
    folder = RLFolder(tmp_path)
    one_step(orchestrator_for(config(None), folder, endpoints), 0)
    trainer_loop(folder).step(0, folder.read_batch(0))
    with pytest.raises(UsageError, match="no online difficulty state of environment 'reverse-text'"):
        orchestrator_for(DIFFICULTY, folder, endpoints)


# --- config -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("orchestrator", "error"), [
    ({"train": {"envs": [{"id": "reverse-text", "difficulty": {"low": 0.9, "high": 0.1}}]}}, "must be below high"),
    ({"eval": {"envs": [{"id": "reverse-text", "difficulty": {}}]}}, "training environments only"),
    ({"group_size": 1, "train": {"envs": [{"id": "reverse-text", "difficulty": {"refills": 2}}]}},
     "refills needs group_size >= 2"),
])
def test_bad_difficulty_settings_are_refused_naming_them(orchestrator, error):
    with pytest.raises(ValueError, match=error):
        RLConfig.model_validate({"trainer": {"model": "tiny"}, "orchestrator": orchestrator})
