"""The embedded VLM's launch settings and `tracegym inference --vlm` (its build and serving: `test_vlm_vllm`)."""

import pytest

from tracegym.cli.main import main
from tracegym.models.embedded import COMPLETE_MARKER
from tracegym.models.embedded_vlm import SCALE_OUT_FLAG, VLM_DIR_NAME, default_vlm_dir, resolved_vlm, vlm_choice
from tracegym.models.launch import server_config
from tracegym.models.model_choice import ModelChoice


@pytest.fixture
def built_vlm(tmp_path, monkeypatch):
    """A cache whose VLM folder is marked built (nothing in it is read here)."""
    monkeypatch.setenv("TRACEGYM_CACHE", str(tmp_path))
    folder = default_vlm_dir()
    folder.mkdir(parents=True)
    (folder / COMPLETE_MARKER).write_text("test\n")
    (folder / "config.json").write_text('{"model_type": "idefics3", "vision_config": {}}')
    return folder


def test_the_vlm_is_served_from_the_cache_with_the_generate_endpoint_open(built_vlm):
    config = server_config(vlm_choice(ModelChoice(vllm_args=["--seed", "1"])))
    assert config.model == str(built_vlm) and config.name == VLM_DIR_NAME
    assert config.extra_args == ["--seed", "1", SCALE_OUT_FLAG]


def test_model_vlm_names_the_embedded_vlms_folder(built_vlm):
    chosen = resolved_vlm(ModelChoice(vlm=True))
    assert chosen.name == str(built_vlm) and not chosen.vlm  # resolved once: a saved config names the folder


def test_a_model_name_is_the_model_over_vlm(built_vlm):
    assert resolved_vlm(ModelChoice(vlm=True, name="/models/other")).name == "/models/other"


def test_the_generate_flag_is_not_added_twice(built_vlm):
    assert server_config(vlm_choice(ModelChoice(vllm_args=[SCALE_OUT_FLAG]))).extra_args == [SCALE_OUT_FLAG]


def test_a_text_model_is_served_without_the_generate_endpoint(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert SCALE_OUT_FLAG not in server_config(ModelChoice(name=str(tmp_path))).extra_args


def test_inference_vlm_with_a_model_name_is_refused_in_one_line(capsys):
    assert main(["inference", "--vlm", "-m", "some/model"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--vlm serves the embedded VLM: leave --model.name unset" in err and len(err.splitlines()) == 1


def test_a_system_message_given_as_parts_renders_as_its_text():
    from jinja2 import Environment

    from tracegym.models.embedded_vlm import CHAT_TEMPLATE

    template = Environment().from_string(CHAT_TEMPLATE)
    user = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}
    as_text = template.render(messages=[{"role": "system", "content": "Be brief."}, user])
    as_parts = template.render(messages=[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, user])
    assert as_parts == as_text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<image>hi<|im_end|>\n"


def test_a_vlm_built_with_an_older_chat_template_gets_the_current_one(built_vlm):
    from tracegym.models.embedded_vlm import CHAT_TEMPLATE, TEMPLATE_FILE, embedded_vlm_dir

    (built_vlm / TEMPLATE_FILE).write_text("{{ 'old' }}")
    assert (embedded_vlm_dir() / TEMPLATE_FILE).read_text() == CHAT_TEMPLATE
