"""Scripted seats: a member played by code (a random legal move, a game's named script, a function by import path)
instead of a model, in process and through an env server; a script a game cannot play is refused by name."""

import pytest

import tracegym as tg
from tracegym.cli.main import main
from tracegym.core.errors import UsageError
from tracegym.envs.evaluate import evaluate_episodes
from tracegym.envs.registry import load_taskset
from tracegym.envs.seats import Seat, SeatChoice
from tracegym.models.endpoint import Endpoint
from tracegym.serve import EnvClient
from tracegym.serve.local_server import local_server
from tracegym.testing import FakeOpenAIServer, ScriptedModel


def kuhn(n: int = 8):
    return load_taskset("kuhn-poker", {"num_tasks": n})


def actions(episode, member: str) -> list[str]:
    return [m.text for m in episode.traces[member].messages if m.role == "assistant"]


async def test_a_random_seat_plays_only_legal_moves_and_never_trains():
    episodes = await evaluate_episodes(kuhn(), ScriptedModel(rule=lambda r: "check call"), rollouts=3,
                                       seats={"player_1": Seat(script="random")})
    assert all(e.ok and e.member_metrics["player_1"]["invalid_moves"] == 0 for e in episodes)
    assert all(e.models["player_1"] == "script:random" and e.trainable == {"player_0": True, "player_1": False}
               for e in episodes)
    assert {a for e in episodes for a in actions(e, "player_1")} == {"check", "bet"}  # player_0 only checks


async def test_a_scripted_seat_replays_the_same_moves_for_the_same_task_and_episode():
    def play():
        return evaluate_episodes(kuhn(), ScriptedModel(rule=lambda r: "bet check"), rollouts=4,
                                 seats={"player_1": Seat(script="nash")})

    first, again = await play(), await play()
    assert [actions(e, "player_1") for e in first] == [actions(e, "player_1") for e in again]


async def test_the_game_s_named_script_plays_as_written():
    [episode] = await evaluate_episodes(kuhn(1), ScriptedModel(rule=lambda r: "check fold"),
                                        seats={"player_1": Seat(script="always-bet")})
    assert actions(episode, "player_1") == ["bet"] and len(actions(episode, "player_0")) == 2  # check, then fold
    assert episode.rewards == {"player_0": -1.0, "player_1": 1.0}


async def test_a_script_given_by_import_path_plays_the_seat():
    [episode] = await evaluate_episodes(kuhn(1), ScriptedModel(rule=lambda r: "bet"),
                                        seats={"player_1": Seat(script="tracegym.tasksets.kuhn_poker:always_bet")})
    assert actions(episode, "player_1") == ["call"] and episode.models["player_1"].startswith("script:")


@pytest.mark.parametrize(("script", "error"), [
    ("perfect", r"seat 'player_1': script 'perfect': KuhnPokerTask has no such scripted player \(scripts: random, "
                r"nash, always-bet"),
    ("no_such_module:f", r"seat 'player_1': script 'no_such_module:f': cannot import 'no_such_module'"),
    ("tracegym.tasksets.kuhn_poker:nope", r"kuhn_poker has no function 'nope'"),
])
async def test_a_script_the_game_cannot_play_is_refused_by_name_before_any_episode(script, error):
    model = ScriptedModel(rule=lambda r: "check")
    with pytest.raises(UsageError, match=error):
        await evaluate_episodes(kuhn(), model, seats={"player_1": Seat(script=script)})
    assert model.requests == []


async def test_a_random_seat_in_a_game_that_lists_no_legal_moves_is_refused_naming_the_hook():
    with pytest.raises(UsageError, match=r"script 'random': DebateTask does not list its legal moves"):
        await evaluate_episodes(load_taskset("debate"), ScriptedModel(rule=lambda r: "x"), num_tasks=1,
                                seats={"judge": Seat(script="random")})


@pytest.mark.parametrize(("fields", "error"), [
    ({"script": "random", "model": Endpoint(base_url="http://127.0.0.1:9/v1", model="m")}, "not both"),
    ({"script": "random", "trainable": True}, "cannot train"),
])
def test_a_seat_is_a_model_or_a_script_and_a_script_never_trains(fields, error):
    with pytest.raises(ValueError, match=error):
        Seat(**fields)


def test_a_seat_choice_with_a_script_becomes_a_scripted_seat_and_refuses_a_model_too():
    policy = Endpoint(base_url="http://127.0.0.1:9/v1", model="policy")
    assert SeatChoice(script="nash").seat(policy) == Seat(script="nash")
    with pytest.raises(ValueError, match="give no model or base_url"):
        SeatChoice(script="nash", model="other")


async def test_a_scripted_seat_crosses_the_wire_and_plays_on_an_env_server():
    with FakeOpenAIServer(rule=lambda r: "bet call", model="bold") as server, \
            local_server("kuhn-poker", {"num_tasks": 4}, workers=1) as address:
        endpoint = Endpoint(base_url=server.base_url, model="bold", api_key_env=None, max_retries=0)
        async with EnvClient(address) as client:
            episodes = await client.evaluate_episodes(kuhn(4), endpoint, seats={"player_1": Seat(script="always-bet")})
    assert all(e.ok and e.models == {"player_0": "bold", "player_1": "script:always-bet"} for e in episodes)
    assert all(actions(e, "player_1") == ["call"] and abs(e.rewards["player_0"]) == 2.0 for e in episodes)
    assert tg.Seat is Seat


def test_the_eval_command_refuses_a_script_the_game_cannot_play_before_any_folder(tmp_path, capsys):
    assert main(["eval", "kuhn-poker", "--seat.player_1.script", "perfect", "--output-dir", str(tmp_path)]) == 2
    assert "seat 'player_1': script 'perfect'" in capsys.readouterr().err and not any(tmp_path.iterdir())
