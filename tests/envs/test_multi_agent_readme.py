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


async def test_the_readme_game_plays_episodes_with_a_pinned_seat():
    class Guesses(tg.Taskset):
        id = "guesses"
        task_class = guess_class()

        def load(self):
            return [{"prompt": "Play.", "id": "0"}]

    picker = ScriptedModel(["four", "2"])  # an invalid move, asked again, then a legal one
    [episode] = await tg.evaluate_episodes(Guesses(), ScriptedModel(["2"]), seats={"picker": tg.Seat(model=picker)})
    assert isinstance(episode, tg.Episode) and episode.ok
    assert episode.rewards == {"picker": 0.0, "guesser": 1.0}
    assert episode.trainable == {"picker": False, "guesser": True}
    assert episode.member_metrics["picker"]["invalid_moves"] == 1
