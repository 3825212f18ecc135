"""The README's multi-agent example runs as printed, through the public names only (`tg.MultiAgentTask`, ...)."""

import re
from pathlib import Path

import tracegym as tg
from tracegym.testing import ScriptedModel

README = Path(__file__).parents[2] / "README.md"


def guess_class() -> type:
    section = README.read_text().split("## Multi-agent", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # the README's own code
    return scope["Guess"]


class Guesses(tg.Taskset):
    id = "guesses"
    task_class = guess_class()

    def load(self):
        return [{"prompt": "Play.", "id": "0"}]


async def test_the_readme_game_plays_episodes_with_a_pinned_seat():
    picker = ScriptedModel(["four", "2"])  # an invalid move, asked again, then a legal one
    [episode] = await tg.evaluate_episodes(Guesses(), ScriptedModel(["2"]), seats={"picker": tg.Seat(model=picker)})
    assert isinstance(episode, tg.Episode) and episode.ok
    assert episode.rewards == {"picker": -1.0, "guesser": 1.0}
    assert episode.outcomes == {"picker": tg.Outcome.LOSS, "guesser": tg.Outcome.WIN}
    assert episode.trainable == {"picker": False, "guesser": True}
    assert episode.member_metrics["picker"]["invalid_moves"] == 1


async def test_the_readme_game_pays_a_forfeit_without_crashing_its_reward():
    picker = ScriptedModel(["four", "five", "six"])  # never a legal move: it forfeits before anything is picked
    [episode] = await tg.evaluate_episodes(Guesses(), ScriptedModel(["2"]), seats={"picker": tg.Seat(model=picker)})
    assert episode.ok and episode.error is None
    assert episode.outcomes == {"picker": tg.Outcome.FORFEIT, "guesser": tg.Outcome.WIN}
    assert episode.rewards == {"picker": -1.0, "guesser": 1.0}


async def test_the_readme_game_seats_a_random_player_from_its_legal_moves():
    episodes = await tg.evaluate_episodes(Guesses(), ScriptedModel(rule=lambda r: "2"), rollouts=12,
                                          seats={"picker": tg.Seat(script="random")})
    assert all(e.ok and e.models["picker"] == "script:random" and not e.trainable["picker"] for e in episodes)
    assert {e.traces["picker"].messages[-1].text for e in episodes} == {"1", "2", "3"}
    assert all(e.member_metrics["picker"]["invalid_moves"] == 0 for e in episodes)
