"""Trace size per image: the bytes a run folder takes for image traces with each image stored once by hash
(`images/<sha256>.<ext>`, rows holding references) against the same rows with every image inline as base64.

Runs colour-codeword (single turn: the picture is in the task row, in the episode record and in the prompt's node)
and image-tictactoe (multi-turn: a board picture per `show_board` call) against scripted models, writes each run's
episodes both ways and prints the bytes per image. `PYTHONPATH=src python benchmarks/images.py`
"""

from __future__ import annotations

import asyncio
import io
import random
import sys
import tempfile
from pathlib import Path

from PIL import Image

import tracegym as tg
from tracegym.config.episode_log import EpisodeLog
from tracegym.config.image_store import ImageStore
from tracegym.core.episode import Episode
from tracegym.core.image_ref import image_bytes
from tracegym.core.messages import ImagePart, TextPart, user
from tracegym.testing import ScriptedModel
from tracegym.testing.images import image_part

ROLLOUTS = 4
TASKS = 16


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _image_count(episodes: list[Episode]) -> int:
    """Image parts the traces' messages carry (the rows also hold the task's own copy)."""
    return sum(isinstance(p, ImagePart) for e in episodes for t in e.traces.values() for m in t.messages
               if isinstance(m.content, list) for p in m.content)


def measure(name: str, episodes: list[Episode]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        stored = EpisodeLog(root / "s" / "traces.jsonl", root / "s" / "episodes.jsonl",
                            images=ImageStore.of(root / "s"))
        inline = EpisodeLog(root / "i" / "traces.jsonl", root / "i" / "episodes.jsonl")
        stored.write(episodes)
        inline.write(episodes)
        images, files = _image_count(episodes), len(list((root / "s" / "images").iterdir()))
        s, i = _size(root / "s"), _size(root / "i")
        unique = _size(root / "s" / "images")
        print(f"{name}: {len(episodes)} rollouts, {images} images in their messages ({files} distinct, "
              f"{unique / files:,.0f} bytes each as PNG)")
        print(f"  inline base64: {i:,} bytes ({i / images:,.0f} per image)")
        print(f"  stored by hash: {s:,} bytes ({s / images:,.0f} per image; rows {s - unique:,}, images/ {unique:,})")
        print(f"  stored / inline: {s / i:.2f}")


def seeing(request) -> str:
    [part] = [p for m in request.messages if isinstance(m.content, list) for p in m.content
              if isinstance(p, ImagePart)]
    pixel = Image.open(io.BytesIO(image_bytes(part.image_url["url"]))).convert("RGB").getpixel((0, 0))
    return "falcon" if pixel[0] > 128 else "copper"


def noise_rows(size: int) -> list[dict]:
    """Rows whose prompt is a `size` x `size` picture of random pixels: a photo-like image PNG cannot shrink."""
    rng = random.Random(0)
    rows = []
    for k in range(TASKS):
        picture = Image.frombytes("RGB", (size, size), rng.randbytes(size * size * 3))
        out = io.BytesIO()
        picture.save(out, format="PNG")
        rows.append({"id": f"noise-{k}", "prompt": [user([image_part(out.getvalue()), TextPart(text="colour?")])]})
    return rows


async def main() -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "tasksets"))  # the scripted tic-tac-toe player
    from test_image_tictactoe import player

    taskset = tg.Taskset(id="noise", data=noise_rows(224))
    traces = await tg.evaluate(taskset, ScriptedModel(rule=lambda request: "grey"), num_tasks=TASKS, rollouts=ROLLOUTS)
    measure("noise 224x224 (photo-like)", [Episode.solo(t) for t in traces])

    for name, options, model in (("colour-codeword 64x64", {"num_tasks": TASKS}, ScriptedModel(rule=seeing)),
                                 ("colour-codeword 224x224", {"num_tasks": TASKS, "size": 224},
                                  ScriptedModel(rule=seeing)),
                                 ("image-tictactoe 96x96", {"num_tasks": TASKS}, ScriptedModel(rule=player))):
        taskset = tg.load_taskset(name.split()[0], options)
        traces = await tg.evaluate(taskset, model, num_tasks=TASKS, rollouts=ROLLOUTS)
        measure(name, [Episode.solo(t) for t in traces])


if __name__ == "__main__":
    asyncio.run(main())
