"""The merge extension on a tiny random Llama: the weights it hands vLLM are the trainer's merged weights, bit for
bit; what it refuses; and the worker method's checks, on a fake worker."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from tracegym.models import merge_extension
from tracegym.models.merge_extension import MergeExtension, merged, read_adapter, read_base
from tracegym.models.vllm_server import MERGE_EXTENSION
from tracegym.train.trainer import Trainer, TrainerConfig, apply_lora


def trained(**options: object) -> Trainer:
    """A tiny LoRA trainer whose adapter is far from zero."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    config = TrainerConfig(model="tiny", lora_rank=4, **options)
    model = apply_lora(model, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    return Trainer(model, config)


def base_checkpoint(trainer: Trainer, folder: Path) -> Path:
    """The trainer's base weights, as a checkpoint folder names and stores them."""
    folder.mkdir()
    weights = {n.removeprefix("base_model.model.").replace(".base_layer.", "."): p.detach().clone()
               for n, p in trainer.model.named_parameters() if "lora_" not in n}
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def test_the_merged_weights_are_the_trainers_bit_for_bit(tmp_path):
    trainer = trained(lora_target_modules=["q_proj", "v_proj", "down_proj"])
    base = read_base(base_checkpoint(trainer, tmp_path / "base"))
    ours = dict(merged(base, read_adapter(trainer.save_weights(tmp_path / "adapter"))))
    theirs = load_file(str(trainer.save_merged(tmp_path / "merged", dtype=torch.float32, changed_only=True)
                           / "model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert not torch.equal(ours["model.layers.1.mlp.down_proj.weight"], base["model.layers.1.mlp.down_proj.weight"])


def test_the_base_leaves_out_the_embeddings_and_keeps_the_stored_dtype(tmp_path):
    trainer = trained()
    folder = base_checkpoint(trainer, tmp_path / "base")
    save_file({k: v.to(torch.bfloat16) for k, v in load_file(str(folder / "model.safetensors")).items()},
              str(folder / "model.safetensors"))
    base = read_base(folder)
    assert "model.embed_tokens.weight" not in base and "lm_head.weight" not in base
    assert "model.norm.weight" in base and {t.dtype for t in base.values()} == {torch.bfloat16}


def test_rslora_scales_by_the_square_root_of_the_rank(tmp_path):
    path = trained().save_weights(tmp_path / "adapter")
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, "use_rslora": True}))
    assert read_adapter(path).scaling == config["lora_alpha"] / config["r"] ** 0.5


@pytest.mark.parametrize("field", ["use_dora", "modules_to_save"])
def test_an_adapter_a_plain_merge_cannot_serve_is_refused_by_name(tmp_path, field):
    path = trained().save_weights(tmp_path / "adapter")
    config = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps({**config, field: True if field == "use_dora" else ["x"]}))
    with pytest.raises(ValueError, match=field):
        read_adapter(path)


def test_an_adapter_of_weights_the_base_lacks_is_refused_before_any_is_handed_over(tmp_path):
    trainer = trained()
    base = read_base(base_checkpoint(trainer, tmp_path / "base"))
    del base["model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(ValueError, match="q_proj"):
        next(merged(base, read_adapter(trainer.save_weights(tmp_path / "adapter"))))


class FakeWorker(MergeExtension):
    """A vLLM worker as the extension sees it: a runner with the served model's weights (under checkpoint names,
    in vLLM's dtype) that records each reload."""

    def __init__(self, served: dict[str, torch.Tensor]) -> None:
        model = SimpleNamespace(named_parameters=lambda: [(n, t.to(torch.bfloat16)) for n, t in served.items()])
        self.reloads: list[dict[str, torch.Tensor]] = []
        self.model_config = SimpleNamespace(dtype=torch.bfloat16)
        self.model_runner = SimpleNamespace(reload_weights=self._reload, get_model=lambda: model)

    def _reload(self, weights_iterator, is_checkpoint_format):
        assert is_checkpoint_format
        self.reloads.append(dict(weights_iterator))


def test_the_worker_reloads_every_kept_weight_and_reads_the_base_once(tmp_path, monkeypatch):
    trainer = trained()
    folder = base_checkpoint(trainer, tmp_path / "base")
    adapter = trainer.save_weights(tmp_path / "adapter")
    reads = []
    monkeypatch.setattr(merge_extension, "read_base", lambda path: reads.append(path) or read_base(path))
    worker = FakeWorker(read_base(folder))
    assert worker.merge_adapter(str(adapter), str(folder)) == len(worker.reloads[0])
    worker.merge_adapter(str(adapter), str(folder))
    assert len(worker.reloads) == 2 and reads == [folder.resolve()]
    assert {value.dtype for value in worker.reloads[0].values()} == {torch.bfloat16}  # what vLLM serves


def test_a_worker_serving_other_weights_refuses_naming_the_base_folder(tmp_path):
    trainer = trained()
    folder = base_checkpoint(trainer, tmp_path / "base")
    served = {name: value + 1 for name, value in read_base(folder).items()}
    with pytest.raises(ValueError, match=r"other weights than the base model in folder 'base' holds \(.* differ"):
        FakeWorker(served).merge_adapter(str(trainer.save_weights(tmp_path / "adapter")), str(folder))


def test_the_extension_vllm_is_told_to_load_is_this_class():
    module, _, name = MERGE_EXTENSION.rpartition(".")
    assert module == merge_extension.__name__ and getattr(merge_extension, name) is MergeExtension
