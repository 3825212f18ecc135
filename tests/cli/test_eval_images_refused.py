"""`tracegym eval` of an image taskset on a model that takes text only: one line naming the taskset, the task and
the message, exit 2, before any folder or server."""

import json

import pytest

from tracegym.cli.main import main
from tracegym.envs.image_input import check_images_taken, first_image
from tracegym.envs.registry import load_taskset


@pytest.fixture
def text_model(tmp_path):
    model = tmp_path / "text-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return model


def _refused(capsys, args: list[str]) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_an_image_prompt_on_a_text_only_model_is_refused_naming_the_task_and_message(tmp_path, capsys, text_model):
    err = _refused(capsys, ["eval", "colour-codeword", "-m", str(text_model), "-n", "2",
                            "--output-dir", str(tmp_path / "out")])
    assert ("taskset 'colour-codeword', task 'colour-codeword-train-0-0', message 1 (user): the taskset shows "
            "images and model 'text-model' takes text only (its config.json has no vision_config)") in err
    assert not (tmp_path / "out").exists()


def test_a_taskset_whose_tools_show_images_is_refused_up_front_too(tmp_path, capsys, text_model):
    err = _refused(capsys, ["eval", "image-tictactoe", "-m", str(text_model), "--output-dir", str(tmp_path / "out")])
    assert "taskset 'image-tictactoe', task 'image-tictactoe-0-0': its tool results or turns show images" in err


def test_the_model_section_can_say_a_model_takes_text_only(tmp_path, capsys):
    err = _refused(capsys, ["eval", "colour-codeword", "--model.base-url", "http://127.0.0.1:9/v1", "-m", "m",
                            "--model.images", "false", "--output-dir", str(tmp_path / "out")])
    assert "model 'm' takes text only" in err


def test_a_text_taskset_shows_no_image_so_a_text_only_model_is_not_refused():
    taskset = load_taskset("reverse-text")
    assert first_image(taskset) is None
    check_images_taken(taskset, False, "m")
