"""Image inputs: images read by hash from a run folder, and where a LoRA adapter goes."""

import hashlib
from types import SimpleNamespace

import pytest

from tracegym.core.errors import UsageError
from tracegym.train.image_inputs import TEXT_TOWER, folder_source, lora_targets


def test_an_image_is_read_from_the_run_folder_by_the_hash_of_its_bytes(tmp_path):
    data = b"\x89PNG\r\n\x1a\n-a-picture"
    sha = hashlib.sha256(data).hexdigest()
    (tmp_path / f"{sha}.png").write_bytes(data)
    assert folder_source(tmp_path)(sha) == data


def test_a_missing_image_is_named_with_the_folder(tmp_path):
    with pytest.raises(ValueError, match=f"image {'0' * 64} is not in {tmp_path}"):
        folder_source(tmp_path)("0" * 64)


def test_a_name_that_is_no_hash_is_never_globbed(tmp_path):
    (tmp_path / "x.png").write_bytes(b"x")
    with pytest.raises(ValueError, match="is not in"):
        folder_source(tmp_path)("*")


def test_a_text_model_gets_its_adapter_on_the_named_layers():
    assert lora_targets(SimpleNamespace(config=SimpleNamespace()), ["q_proj"], projector=False) == ["q_proj"]


def test_an_adapter_on_the_projector_of_a_text_model_is_refused():
    with pytest.raises(UsageError, match="lora_projector"):
        lora_targets(SimpleNamespace(config=SimpleNamespace()), ["q_proj"], projector=True)


def test_a_vlm_gets_its_adapter_on_its_text_tower_only():
    vlm = SimpleNamespace(config=SimpleNamespace(model_type="idefics3", vision_config={}))
    assert lora_targets(vlm, ["q_proj", "up_proj"], projector=False) == rf"{TEXT_TOWER}\.(?:q_proj|up_proj)"


def test_a_vlm_of_another_architecture_is_refused_by_type():
    other = SimpleNamespace(config=SimpleNamespace(model_type="qwen2_5_vl", vision_config={}))
    with pytest.raises(UsageError, match="'qwen2_5_vl'"):
        lora_targets(other, ["q_proj"], projector=False)
