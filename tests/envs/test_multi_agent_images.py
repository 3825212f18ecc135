"""A multi-agent view of an image: the referee shows one member a picture; only that member's view holds it, and
the others see its public reply."""

from typing import ClassVar

import tracegym as tg
from tracegym.core.messages import ContentPart, ImagePart, TextPart
from tracegym.core.task_data import TaskData
from tracegym.envs.multi_agent import MultiAgentTask
from tracegym.envs.schedule import Member
from tracegym.envs.scorers import reward
from tracegym.testing import ScriptedModel
from tracegym.testing.images import image_part, png


class ShowAndTell(MultiAgentTask):
    """`looker` is shown a red picture and names its colour; `teller` hears it and repeats it."""

    seats: ClassVar = (Member(id="looker"), Member(id="teller"))

    def observe(self, member: str) -> str | list[ContentPart] | None:
        if member == "looker":
            return [image_part(png((255, 0, 0))), TextPart(text="What colour is this picture?")]
        return "Repeat the colour the looker named."

    @reward
    def told(self, trace) -> float:
        return float("red" in trace.last_reply)


class ShowAndTellGames(tg.Taskset):
    id = "show-and-tell"
    task_class = ShowAndTell


def _images(trace) -> list[ImagePart]:
    return [p for m in trace.messages if isinstance(m.content, list) for p in m.content if isinstance(p, ImagePart)]


async def test_only_the_member_the_referee_showed_a_picture_sees_it():
    taskset = ShowAndTellGames(data=[TaskData(prompt="A picture game.")])
    model = ScriptedModel(["It is red.", "red"])
    [episode] = await tg.evaluate_episodes(taskset, model, num_tasks=1)
    looker, teller = episode.traces["looker"], episode.traces["teller"]
    assert len(_images(looker)) == 1 and _images(teller) == []
    assert any(m.text == "[looker] It is red." for m in teller.messages)
    assert episode.rewards == {"looker": 1.0, "teller": 1.0}
