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
    """A tiny LoRA trainer whose adapter is far from zero, in float32 (`base_checkpoint` writes its weights as the
    checkpoint; in bfloat16 they would be stored rounded, and `save_merged` would read a folder "tiny")."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    config = TrainerConfig(model="tiny", lora_rank=4, compute_dtype="float32", **options)
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
        model = SimpleNamespace(named_parameters=lambda: [(n, t.to(torch.bfloat16)) for n, t in served.items()],
                                named_modules=lambda: [])  # no layer packed for the CPU: vLLM's reload
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


class UnquantizedLinearMethod:
    """vLLM's plain linear method as the CPU build runs it: the weight is handed to a kernel (here a copy)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        layer.kernel = layer.weight.detach().clone()
        layer.weight = torch.nn.Parameter(torch.empty(0, dtype=layer.weight.dtype), requires_grad=False)


class PackedLinear(torch.nn.Module):
    """A vLLM linear layer after the CPU build packed it: stacked `output_sizes` rows, an empty weight."""

    def __init__(self, output_sizes: list[int], input_size: int, bias: bool = False) -> None:
        super().__init__()
        self.output_sizes, self.input_size, self.tp_size, self.cpu_linear = output_sizes, input_size, 1, None
        self.quant_method = UnquantizedLinearMethod()
        self.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.bfloat16), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.zeros(sum(output_sizes)), requires_grad=False) if bias else None


class PackedLlama(torch.nn.Module):
    """The tiny Llama as vLLM's CPU build holds it: fused qkv_proj and gate_up_proj, norms under checkpoint names."""

    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, base: dict[str, torch.Tensor], qkv_bias: bool = False, unpacked: str = "") -> None:
        super().__init__()
        for name, value in base.items():
            module, _, kind = name.rpartition(".")
            parent, _, leaf = module.rpartition(".")
            if kind == "bias":  # only a packed layer holds one (qkv_bias)
                continue
            if value.dim() == 1:
                self._place(name, torch.nn.Parameter(value.to(torch.bfloat16), requires_grad=False))
            elif leaf in ("q_proj", "gate_proj"):
                parts = [base[f"{parent}.{p}.weight"] for p in self.packed_modules_mapping[
                    "qkv_proj" if leaf == "q_proj" else "gate_up_proj"]]
                whole = f"{parent}.{'qkv_proj' if leaf == 'q_proj' else 'gate_up_proj'}"
                self._place(whole, PackedLinear([p.shape[0] for p in parts], value.shape[1],
                                                      bias=qkv_bias and leaf == "q_proj"))
            elif leaf in ("o_proj", "down_proj"):
                self._place(module, PackedLinear([value.shape[0]], value.shape[1]))
        if unpacked:  # a layer vLLM left as it was (e.g. a GPU's, or a kernel the CPU build does not pack for)
            self.get_submodule(unpacked).weight = torch.nn.Parameter(torch.ones(2, 2), requires_grad=False)

    def _place(self, path: str, value: torch.nn.Module | torch.nn.Parameter) -> None:
        """Put `value` at dotted `path`, making the modules above it."""
        owner: torch.nn.Module = self
        above, _, leaf = path.rpartition(".")
        for part in above.split("."):
            if not hasattr(owner, part):
                owner.add_module(part, torch.nn.Module())
            owner = getattr(owner, part)
        if isinstance(value, torch.nn.Parameter):
            owner.register_parameter(leaf, value)
        else:
            owner.add_module(leaf, value)


class PackedWorker(MergeExtension):
    """A vLLM CPU worker whose model's linear layers are packed; it must not be asked to reload."""

    def __init__(self, model: PackedLlama) -> None:
        self.model_config = SimpleNamespace(dtype=torch.bfloat16)
        self.model_runner = SimpleNamespace(get_model=lambda: model, reload_weights=self._reload,
                                            reset_encoder_cache=lambda: None, reset_mm_cache=lambda: None)

    def _reload(self, weights_iterator, is_checkpoint_format):
        raise AssertionError("a packed model's layers are rebuilt in place, not reloaded")


def served_kernels(model: PackedLlama) -> dict[str, torch.Tensor]:
    return {name: layer.kernel for name, layer in model.named_modules() if isinstance(layer, PackedLinear)}


def expected_kernels(base: dict[str, torch.Tensor], adapter_folder: Path) -> dict[str, torch.Tensor]:
    """Each packed layer's weight as vLLM's reload would stack `merged`'s bfloat16 weights."""
    weights = dict(merged(base, read_adapter(adapter_folder), torch.bfloat16))
    out = {}
    for layer in range(2):
        attn, mlp = f"model.layers.{layer}.self_attn", f"model.layers.{layer}.mlp"
        out[f"{attn}.qkv_proj"] = torch.cat([weights[f"{attn}.{p}_proj.weight"] for p in "qkv"])
        out[f"{attn}.o_proj"] = weights[f"{attn}.o_proj.weight"]
        out[f"{mlp}.gate_up_proj"] = torch.cat([weights[f"{mlp}.{p}_proj.weight"] for p in ("gate", "up")])
        out[f"{mlp}.down_proj"] = weights[f"{mlp}.down_proj.weight"]
    return out


def packed_setup(tmp_path: Path, **model_options: object) -> tuple[Trainer, Path, PackedLlama]:
    trainer = trained(lora_target_modules=["q_proj", "v_proj", "up_proj", "down_proj"])
    folder = base_checkpoint(trainer, tmp_path / "base")
    return trainer, folder, PackedLlama(read_base(folder), **model_options)


def test_a_packed_layer_is_rebuilt_from_the_stacked_merged_weights_bit_for_bit(tmp_path):
    trainer, folder, model = packed_setup(tmp_path)
    adapter = trainer.save_weights(tmp_path / "adapter")
    worker = PackedWorker(model)
    assert worker.merge_adapter(str(adapter), str(folder)) == 14  # 2 layers x 7 weights, stacked into 4 layers
    served, expected = served_kernels(model), expected_kernels(read_base(folder), adapter)
    assert sorted(served) == sorted(expected) and all(torch.equal(served[n], expected[n]) for n in expected)


def test_fifty_successive_merges_each_serve_base_plus_their_own_delta_exactly(tmp_path):
    trainer, folder, model = packed_setup(tmp_path)
    worker, base = PackedWorker(model), read_base(folder)
    generator = torch.Generator().manual_seed(1)
    for sync in range(50):  # each merge starts from the kept base, so nothing of earlier ones can accumulate
        with torch.no_grad():
            for name, param in trainer.model.named_parameters():
                if "lora_B" in name:
                    param.add_(torch.randn(param.shape, generator=generator) * 0.01)
        adapter = trainer.save_weights(tmp_path / "adapter")
        worker.merge_adapter(str(adapter), str(folder))
        if sync % 10 == 9:
            served, expected = served_kernels(model), expected_kernels(base, adapter)
            assert all(torch.equal(served[name], expected[name]) for name in expected), f"after sync {sync + 1}"


def test_a_packed_layers_bias_is_restacked_from_the_base(tmp_path):
    trainer, folder, _ = packed_setup(tmp_path)
    base = read_base(folder)
    for part in ("q", "k", "v"):
        base[f"model.layers.0.self_attn.{part}_proj.bias"] = torch.randn(base[f"model.layers.0.self_attn.{part}_proj"
                                                                               f".weight"].shape[0])
    save_file(base, str(folder / "model.safetensors"))
    model = PackedLlama(base, qkv_bias=True)
    PackedWorker(model).merge_adapter(str(trainer.save_weights(tmp_path / "adapter")), str(folder))
    expected = torch.cat([base[f"model.layers.0.self_attn.{p}_proj.bias"] for p in "qkv"])
    assert torch.equal(model.get_submodule("model.layers.0.self_attn.qkv_proj").bias, expected)


def test_an_adapted_layer_vllm_did_not_pack_goes_through_vllms_reload(tmp_path):
    trainer, folder, model = packed_setup(tmp_path, unpacked="model.layers.1.mlp.down_proj")
    worker = PackedWorker(model)
    reloads = []
    worker.model_runner.reload_weights = lambda weights_iterator, is_checkpoint_format: reloads.append(
        dict(weights_iterator))
    assert worker.merge_adapter(str(trainer.save_weights(tmp_path / "adapter")), str(folder)) == len(reloads[0])
    assert "model.layers.1.mlp.down_proj.weight" in reloads[0]


def test_the_extension_vllm_is_told_to_load_is_this_class():
    module, _, name = MERGE_EXTENSION.rpartition(".")
    assert module == merge_extension.__name__ and getattr(merge_extension, name) is MergeExtension
