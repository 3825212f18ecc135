"""Seating: who plays each seat of an RL run's episodes: shared-policy self-play by default, one learner per
episode (alternating or seeded-random) against the policy, the base model or the opponent pool, pinned seats;
and the RL config's checks of it (unknown seat, single-agent taskset, base weights kept)."""

import random

import pytest
from pydantic import ValidationError

from tracegym.core.errors import UsageError
from tracegym.models.endpoint import Endpoint
from tracegym.serve.local_server import local_server
from tracegym.train.rl_config import RLConfig, lora_slots, parse_rl_args
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for
from tracegym.train.seating import Play, SeatChoice, Seating

VLLM = Endpoint(base_url="http://127.0.0.1:8000/v1", model="base")
MEMBERS = ["player_0", "player_1"]


def seating(play: Play, pinned: dict | None = None, opponents=None) -> Seating:
    return Seating(MEMBERS, play, pinned or {}, VLLM, "base", opponents)


def models(binding: dict) -> dict:
    """member -> (model name or 'policy', trainable)."""
    return {m: (s.model.model if s.model else "policy", s.trainable) for m, s in binding.items()}


def test_by_default_every_seat_is_the_policy_and_trains_as_its_task_says():
    assert models(seating(Play()).next("policy", random.Random(0))) == {"player_0": ("policy", None),
                                                                       "player_1": ("policy", None)}


def test_an_alternating_learner_takes_the_seats_in_turn_against_the_base_model():
    seats = seating(Play(learner="alternate", opponent="base"))
    bindings = [models(seats.next("policy", random.Random(0))) for _ in range(3)]
    assert bindings == [{"player_0": ("policy", None), "player_1": ("base", False)},
                        {"player_0": ("base", False), "player_1": ("policy", None)},
                        {"player_0": ("policy", None), "player_1": ("base", False)}]


def test_a_random_learner_is_drawn_with_the_runs_generator_so_a_rerun_seats_the_same():
    def learners(seed: int) -> list[str]:
        seats, rng = seating(Play(learner="random")), random.Random(seed)
        return [next(m for m, s in seats.next("policy", rng).items() if s.model is None) for _ in range(20)]

    assert learners(3) == learners(3) and set(learners(3)) == set(MEMBERS)


def test_opponents_from_the_pool_are_drawn_per_episode():
    draws = iter(["pool-step-000005", "base"])
    seats = seating(Play(learner="alternate", opponent="pool"), opponents=lambda rng, play: next(draws))
    assert models(seats.next("policy", random.Random(0)))["player_1"] == ("pool-step-000005", False)
    assert models(seats.next("policy", random.Random(0)))["player_0"] == ("base", False)


def test_a_pinned_seat_keeps_its_model_and_the_learner_never_takes_it():
    pinned = {"player_1": SeatChoice(model="judge-model", base_url="http://judge:8000/v1")}
    seats = seating(Play(learner="alternate", opponent="base"), pinned)
    for _ in range(2):
        binding = seats.next("policy", random.Random(0))
        assert binding["player_1"].model.base_url == "http://judge:8000/v1" and binding["player_0"].model is None


def test_a_seat_pinned_to_train_keeps_its_flag():
    binding = seating(Play(), {"player_1": SeatChoice(trainable=True)}).next("policy", random.Random(0))
    assert binding["player_1"].trainable is True and binding["player_1"].model is None


def test_the_alternation_is_state_a_resume_restores():
    first = seating(Play(learner="alternate"))
    first.next("policy", random.Random(0))
    resumed = seating(Play(learner="alternate"))
    resumed.load_state_dict(first.state_dict())
    assert models(resumed.next("policy", random.Random(0))) == models(first.next("policy", random.Random(0)))


def test_every_seat_pinned_leaves_no_seat_for_the_learner():
    pinned = {m: SeatChoice(model="base") for m in MEMBERS}
    with pytest.raises(UsageError, match="none is left for the learner"):
        seating(Play(learner="alternate"), pinned)


def test_a_scripted_opponent_sits_in_every_seat_but_the_learners():
    seats = seating(Play(learner="alternate", opponent="script", script="nash"))
    bindings = [seats.next("policy", random.Random(0)) for _ in range(2)]
    assert [{m: s.script for m, s in b.items()} for b in bindings] == [{"player_0": None, "player_1": "nash"},
                                                                       {"player_0": "nash", "player_1": None}]
    assert all(s.model is None for b in bindings for s in b.values())


def test_a_seat_pinned_to_a_script_keeps_it_and_the_learner_never_takes_it():
    seats = seating(Play(learner="alternate", opponent="base"), {"player_1": SeatChoice(script="random")})
    for _ in range(2):
        binding = seats.next("policy", random.Random(0))
        assert binding["player_1"].script == "random" and binding["player_0"].model is None
    assert seating(Play(), {"player_1": SeatChoice(script="random")}).learner_seats() == [None]


@pytest.mark.parametrize("play", [{"learner": "alternate", "opponent": "script"},
                                  {"learner": "alternate", "opponent": "base", "script": "nash"}])
def test_a_scripted_opponent_and_its_script_go_together(play):
    with pytest.raises(ValidationError, match="opponent = 'script' and script = NAME go together"):
        Play(**play)


def test_a_pinned_script_takes_no_model_and_never_trains():
    with pytest.raises(ValidationError, match="cannot train"):
        SeatChoice(script="random", trainable=True)


def test_an_opponent_needs_a_single_learner():
    with pytest.raises(ValidationError, match="needs a single learner"):
        Play(opponent="base")


# --- the RL config -------------------------------------------------------------------------------------------
def rl(env: dict, **fields) -> RLConfig:
    return RLConfig.model_validate({"trainer": {"model": "tiny"}, "weight_sync": "lora",
                                    "orchestrator": {"train": {"envs": [{"id": "kuhn-poker", **env}]}}, **fields})


def test_a_seat_override_naming_a_seat_the_taskset_has_not_is_refused_naming_it():
    with pytest.raises(UsageError, match=r"--orchestrator.train.envs.0.seats: seat 'player_9': taskset 'kuhn-poker' "
                                         r"has no such seat"):
        parse_rl_args(["--orchestrator.train.envs", '[{"id": "kuhn-poker", "seats": {"player_9": {}}}]',
                       "--weight-sync", "lora"])


@pytest.mark.parametrize(("env", "flag"), [
    ('{"id": "kuhn-poker", "seats": {"player_1": {"script": "perfect"}}}', r"envs\.0\.seats\.player_1\.script"),
    ('{"id": "kuhn-poker", "play": {"learner": "alternate", "opponent": "script", "script": "perfect"}}',
     r"envs\.0\.play\.script"),
])
def test_a_script_the_game_cannot_play_is_refused_naming_the_flag(env, flag):
    with pytest.raises(UsageError, match=flag + r": script 'perfect': KuhnPokerTask has no such scripted player"):
        parse_rl_args(["--orchestrator.train.envs", f"[{env}]"])


def test_seating_a_single_agent_taskset_is_refused():
    with pytest.raises(UsageError, match=r"--orchestrator\.train\.envs\.0: taskset 'reverse-text' is single-agent"):
        parse_rl_args(["--orchestrator.train.envs", '[{"id": "reverse-text", "play": {"learner": "alternate"}}]'])


def test_a_taskset_that_cannot_be_imported_here_leaves_its_seats_to_its_env_server_with_a_warning(tmp_path):
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("import a_module_only_the_env_host_has\n")
    _, warnings = parse_rl_args(["--orchestrator.train.envs", f'[{{"id": "{elsewhere}:Game", "seats": {{"p": {{}}}}}}]',
                                 "--weight-sync", "lora"])
    assert any("cannot be loaded here" in w and "checked against its env server" in w for w in warnings)


def test_the_orchestrator_refuses_a_seat_its_env_server_does_not_serve(tmp_path):
    config = rl({"seats": {"player_9": {"trainable": False}}})  # a config file the command line never checked
    with local_server("kuhn-poker", workers=1) as address:
        endpoints = Endpoints(base_url="http://127.0.0.1:9/v1", base_model="base", envs={"kuhn-poker": address})
        with pytest.raises(UsageError, match=r"orchestrator.train.envs.0.seats: seat 'player_9': taskset "
                                             r"'kuhn-poker' has no such seat \(seats: player_0, player_1\)"):
            orchestrator_for(config, RLFolder(tmp_path), endpoints)


def test_playing_the_base_model_or_the_pool_needs_lora_weight_sync():
    with pytest.raises(ValidationError, match="needs weight_sync = 'lora'"):
        rl({"play": {"learner": "alternate", "opponent": "pool"}}, weight_sync="merged")


def test_vllm_holds_an_adapter_slot_per_pool_policy_besides_the_learners():
    assert lora_slots(rl({"play": {"learner": "alternate", "opponent": "pool", "pool_latest": 3}}).orchestrator) == 4
    assert lora_slots(rl({}).orchestrator) == 1
