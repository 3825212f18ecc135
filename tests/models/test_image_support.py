"""Image support: which models take images (one place), which images a model may be given, and the rollout that
refuses the rest by name while its siblings go on."""

import base64
import json

import pytest

import tracegym as tg
from tracegym.core.errors import FailureKind
from tracegym.core.image_ref import data_uri
from tracegym.core.messages import ImagePart, TextPart, user
from tracegym.models.image_support import ImagePolicy, image_problem, refused_image, takes_images
from tracegym.models.model_choice import ModelChoice
from tracegym.testing import FakeOpenAIServer, ScriptedModel
from tracegym.testing.images import image_part, png


def _model_dir(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", **config}))
    return tmp_path


def test_a_model_takes_images_when_its_config_has_a_vision_config(tmp_path):
    assert takes_images(_model_dir(tmp_path / "a", vision_config={"hidden_size": 8})) is True
    assert takes_images(_model_dir(tmp_path / "b")) is False
    assert takes_images(tmp_path / "nothing-here") is None and takes_images("HuggingFaceTB/SmolVLM") is None


@pytest.fixture(autouse=True)
def _dirs(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()


def test_an_endpoint_of_weights_here_is_told_whether_they_take_images_unless_the_choice_says(tmp_path):
    text = _model_dir(tmp_path / "b")
    assert ModelChoice().endpoint("http://h/v1", "m", weights=str(text)).images is False
    assert ModelChoice(images=True).endpoint("http://h/v1", "m", weights=str(text)).images is True
    assert ModelChoice().endpoint("http://h/v1", "m").images is None


def test_a_good_png_can_be_given():
    assert image_problem(data_uri("image/png", png())) is None


@pytest.mark.parametrize(("url", "said"), [
    ("data:image/png;base64,abc", "unreadable: its base64 is broken"),
    (data_uri("image/png", png()[:40]), "unreadable png"),
    (data_uri("image/svg+xml", b"<svg xmlns='http://www.w3.org/2000/svg'/>"),
     "a format the model's processor does not take (declared image/svg+xml; it takes png, jpeg, gif, webp, bmp)"),
])
def test_a_bad_image_is_refused_saying_why(url, said):
    assert said in str(image_problem(url))


def test_an_image_past_the_byte_or_pixel_limit_is_oversized():
    assert image_problem(data_uri("image/png", png(size=64)), max_bytes=50).startswith("oversized: ")
    assert image_problem(data_uri("image/png", png(size=64)), max_pixels=1000) == (
        "oversized: 64x64 pixels, more than max_image_pixels = 1,000")


def test_an_image_elsewhere_is_not_read():
    assert image_problem("https://example.com/cat.png") is None


def test_the_refusal_names_the_message_and_the_image():
    messages = [user("hi"), user([TextPart(text="look"), image_part(png()), image_part(b"GIF89a broken", "image/gif")])]
    assert refused_image(messages, ImagePolicy("m")).startswith("message 1 (user), image 2: unreadable gif")
    assert refused_image(messages, ImagePolicy("m", takes=False)) == (
        "message 1 (user), image 1: model 'm' takes text only (its config.json has no vision_config)")


def _rows():
    broken = ImagePart(image_url={"url": "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nno").decode()})
    return [{"id": "good", "prompt": [user([image_part(png()), TextPart(text="colour?")])]},
            {"id": "bad", "prompt": [user([broken, TextPart(text="colour?")])]}]


async def test_a_rollout_with_an_unreadable_image_fails_by_name_and_its_sibling_runs():
    model = ScriptedModel(rule=lambda request: "red")
    traces = await tg.evaluate(tg.Taskset(id="pictures", data=_rows()), model, num_tasks=2)
    by_key = {t.task_key: t for t in traces}
    assert by_key["good"].ok and by_key["good"].last_reply == "red"
    [error] = by_key["bad"].errors
    assert error.failure == FailureKind.IMAGE_REFUSED and error.stage == "model"
    assert error.message.startswith("taskset 'pictures', task 'bad', message 0 (user), image 1: unreadable png")
    assert len(model.requests) == 1  # the bad one never reached the model


async def test_a_text_only_endpoint_is_never_sent_an_image():
    with FakeOpenAIServer(["red"]) as server:
        endpoint = tg.Endpoint(base_url=server.base_url, model=server.model, images=False, api_key_env=None)
        rows = [{"id": "text", "prompt": "colour?"}, _rows()[0]]
        traces = await tg.evaluate(tg.Taskset(id="pictures", data=rows), endpoint, num_tasks=2)
    by_key = {t.task_key: t for t in traces}
    assert by_key["text"].ok, by_key["text"].errors
    assert len(server.requests) == 1
    assert by_key["good"].failure == FailureKind.IMAGE_REFUSED
    assert f"model {server.model!r} takes text only" in by_key["good"].errors[0].message
