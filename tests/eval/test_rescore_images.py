"""Re-scoring a run folder's traces whose images it stores by hash: rewards that look at an image get its bytes."""

import io

from PIL import Image

import tracegym as tg
from tracegym.core.episode import Episode
from tracegym.core.image_ref import image_bytes
from tracegym.core.messages import ImagePart, TextPart, user
from tracegym.core.trace import RewardScore
from tracegym.envs.rollout import Timeouts
from tracegym.eval.rescore import rescore
from tracegym.eval.run_folder import RunFolder
from tracegym.testing import ScriptedModel
from tracegym.testing.images import image_part, png


def red_share(task, trace) -> float:
    """How red the prompt's picture is (read from its bytes)."""
    [part] = [p for p in trace.task.prompt[0].content if isinstance(p, ImagePart)]
    r, g, b = Image.open(io.BytesIO(image_bytes(part.image_url["url"]))).convert("RGB").getpixel((0, 0))
    return r / (r + g + b)


async def test_a_reward_reading_an_image_scores_the_same_after_the_folder_stored_it(tmp_path):
    rows = [{"prompt": [user([image_part(png(colour)), TextPart(text="colour?")])], "answer": "x"}
            for colour in ((255, 0, 0), (85, 85, 85))]
    taskset = tg.Taskset(id="pictures", data=rows, rewards=[red_share])
    traces = await tg.evaluate(taskset, ScriptedModel(["red", "grey"]), num_tasks=2)
    folder = RunFolder.create(tmp_path, "pictures", "scripted", run_id="run")
    folder.write_config({"taskset": {"id": "pictures"}})
    for trace in traces:
        folder.log.append(Episode.solo(trace))
    folder.log.close()
    assert ";base64," not in folder.traces_path.read_text()
    stored = RunFolder.open(folder.path).log.read().traces
    for trace in stored:  # as if an older reward had scored them
        trace.rewards = {"red_share": RewardScore(score=0.0)}
    rescored = await rescore(taskset, stored, Timeouts())
    assert sorted(t.reward for t in rescored.traces) == sorted(t.reward for t in traces) == [1 / 3, 1.0]
