"""colour-codeword: generated pictures, a code word per colour, exact-match reward, disjoint splits."""

import io

from PIL import Image

import tracegym as tg
from tracegym.core.image_ref import image_bytes
from tracegym.core.messages import ImagePart
from tracegym.tasksets.colour_codeword import CODEWORDS, COLOURS, normalized
from tracegym.testing import ScriptedModel


def _picture(messages) -> Image.Image:
    [part] = [p for m in messages if isinstance(m.content, list) for p in m.content if isinstance(p, ImagePart)]
    return Image.open(io.BytesIO(image_bytes(part.image_url["url"]))).convert("RGB")


def seeing(request) -> str:
    """A model that looks at the picture: the code word of the colour nearest its top-left pixel."""
    pixel = _picture(request.messages).getpixel((0, 0))
    nearest = min(COLOURS, key=lambda c: sum((a - b) ** 2 for a, b in zip(COLOURS[c], pixel, strict=True)))
    return f" {CODEWORDS[nearest].capitalize()}."


def test_each_row_shows_a_picture_of_its_colour_at_the_configured_size():
    for row in tg.load_taskset("colour-codeword", {"num_tasks": 20, "size": 32}):
        picture = _picture(row.prompt)
        assert picture.size == (32, 32)
        assert row.answer == CODEWORDS[row.colour]
        colours = picture.getcolors()
        assert max(colours)[1] == tuple(row.shade) or min(colours)[1] == tuple(row.shade)


def test_the_system_prompt_maps_each_colour_used_to_its_code_word():
    row = tg.load_taskset("colour-codeword", {"colours": 3})[0]
    assert "red = falcon, green = copper, blue = tulip." in row.system_prompt
    assert "yellow" not in row.system_prompt


def test_train_and_held_out_rows_never_show_the_same_picture():
    def pictures(split: str, seed: int) -> set[bytes]:
        rows = tg.load_taskset("colour-codeword", {"num_tasks": 300, "split": split, "seed": seed, "jitter": 3,
                                                   "size": 8})
        return {image_bytes(p.image_url["url"]) for r in rows for p in r.prompt[0].content
                if isinstance(p, ImagePart)}

    train, held_out = pictures("train", 0), pictures("held-out", 0) | pictures("held-out", 1)
    assert len(train) > 100 and len(held_out) > 100 and not train & held_out


def test_the_same_seed_gives_the_same_rows():
    assert list(tg.load_taskset("colour-codeword", {"num_tasks": 5})) == list(
        tg.load_taskset("colour-codeword", {"num_tasks": 5}))


async def test_a_model_that_sees_the_colour_earns_the_reward_and_one_that_guesses_does_not():
    taskset = tg.load_taskset("colour-codeword", {"num_tasks": 8})
    seen = await tg.evaluate(taskset, ScriptedModel(rule=seeing), num_tasks=8)
    guessed = await tg.evaluate(taskset, ScriptedModel(rule=lambda request: "falcon"), num_tasks=8)
    assert [t.reward for t in seen] == [1.0] * 8
    assert sum(t.reward for t in guessed) == sum(r.colour == "red" for r in taskset)


def test_a_reply_is_compared_without_spaces_quotes_case_or_a_final_stop():
    assert normalized(' "Falcon". ') == "falcon" and normalized("falcon, I think") != "falcon"
