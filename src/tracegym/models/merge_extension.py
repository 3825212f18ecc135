"""Merge extension: a method vLLM's workers gain (`--worker-extension-cls`) to serve a LoRA adapter merged into
their base weights in place, read from the adapter's folder with no full-weights file in between.

`MergedWeightSync` calls `merge_adapter` through vLLM's `/collective_rpc` (dev mode) with the adapter's folder and
the base model's. The first call reads the base checkpoint's weights, all but the input and output embeddings no
adapter touches, and keeps them in the worker as stored (SmolLM2-135M: 0.42 GB of float32; kept as stored so that
a small update still moves a bfloat16 weight across a rounding step). Each call checks that vLLM serves that base
(the weights no adapter changes are equal) and computes `W + s * B @ A` in float32 for every adapted weight, exactly
as `Trainer.save_merged` does (so vLLM serves the same bits either way), always from the kept base (so nothing of
an earlier merge can accumulate). On vLLM's CPU build, whose linear layers hand their weight to oneDNN and keep an
empty tensor, each layer is rebuilt directly: its merged weights are written, rounded to vLLM's dtype, into one
stacked tensor (fused projections, qkv and gate_up, stack the parts the model's `packed_modules_mapping` lists) and
the layer re-runs `process_weights_after_loading`, which packs it again. That is what vLLM's in-place reload ends
in, without its per-layer meta tensors, wrapped loaders and extra copies. Anywhere else (a GPU, where CUDA graphs
hold the weights; a layer not packed; a weight no layer takes) every kept weight goes through that reload, which
restacks and redoes what vLLM derives from them. The trainer writes its 20 MB adapter, not 210 MB of merged
weights (`benchmarks/weight_sync.py`; where the seconds go: `benchmarks/weight_sync_profile.py`).

>>> VLLMServerConfig(model=path, merge_adapters=True)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
log = logging.getLogger(__name__)

EMBEDDINGS = ("embed_tokens.weight", "lm_head.weight")
"""Checkpoint names (suffixes) of the input / output embeddings, which vLLM holds already and no adapter of ours
touches; any other name is reloaded at every merge."""


@dataclass(frozen=True)
class Adapter:
    """A peft LoRA adapter as the merge needs it: checkpoint weight name -> (A, B), and the scale `s`."""

    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]]
    scaling: float


def read_adapter(folder: Path) -> Adapter:
    """The LoRA adapter peft saved in `folder`; a ValueError naming what it holds that a plain merge cannot do."""
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    unsupported = [key for key in ("use_dora", "fan_in_fan_out", "modules_to_save") if config.get(key)]
    if unsupported:
        raise ValueError(f"adapter {folder} sets {', '.join(unsupported)}: only plain LoRA merges in vLLM")
    rank, alpha = config["r"], config["lora_alpha"]
    scaling = alpha / rank ** 0.5 if config.get("use_rslora") else alpha / rank
    tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name in tensors:
        if not name.endswith(".lora_A.weight"):
            if not name.endswith(".lora_B.weight"):
                raise ValueError(f"adapter {folder} holds {name!r}, which is not a LoRA A or B matrix")
            continue
        module = name.removesuffix(".lora_A.weight")
        weight = f"{module.removeprefix('base_model.model.')}.weight"
        pairs[weight] = (tensors[name], tensors[f"{module}.lora_B.weight"])
    return Adapter(pairs, scaling)


def read_base(folder: Path) -> dict[str, torch.Tensor]:
    """Every weight of the checkpoint in `folder` (its `*.safetensors` files) but the embeddings, as stored."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} holds no *.safetensors checkpoint to merge adapters into")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            weights |= {name: handle.get_tensor(name) for name in handle.keys()  # noqa: SIM118
                        if not name.endswith(EMBEDDINGS)}
    return weights


def merged(base: dict[str, torch.Tensor], adapter: Adapter, dtype: torch.dtype | None = None,
           ) -> Iterator[tuple[str, torch.Tensor]]:
    """Every base weight, adapted ones with `s * B @ A` added in float32, each rounded to `dtype` (what vLLM
    serves; None: as stored), one at a time (the extra memory is one weight's)."""
    check_adapted(base, adapter)
    scratch = scratch_for(base[name] for name in adapter.pairs)
    for name, weight in base.items():
        out = torch.empty(weight.shape, dtype=weight.dtype if dtype is None else dtype)
        merge_into(out, weight, adapter.pairs.get(name), adapter.scaling, scratch)
        yield name, out


def check_adapted(base: dict[str, torch.Tensor], adapter: Adapter) -> None:
    """A ValueError when the adapter adapts weights the base does not hold."""
    missing = sorted(set(adapter.pairs) - set(base))
    if missing:
        raise ValueError(f"the adapter adapts weights the base checkpoint does not hold (or embeddings): {missing[:3]}")


def merge_into(out: torch.Tensor, weight: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor] | None,
               scaling: float, scratch: torch.Tensor) -> None:
    """Write `weight + scaling * B @ A` (computed in float32, in `scratch`, a flat float32 tensor at least as large;
    `weight` as it is without a pair) into `out`, rounded to its dtype: the same bits as `Trainer.save_merged`.
    One scratch for every weight of a merge: a new float32 tensor per weight made the merge 1.3x slower."""
    if pair is None:
        out.copy_(weight)
        return
    a, b = pair
    total = out if out.dtype == torch.float32 else scratch[:weight.numel()].view(weight.shape)
    torch.addmm(weight.float(), b.float(), a.float(), alpha=scaling, out=total)
    if total is not out:
        out.copy_(total)


def scratch_for(weights: Iterable[torch.Tensor]) -> torch.Tensor:
    """A flat float32 tensor `merge_into` can use for any of `weights`."""
    return torch.empty(max((weight.numel() for weight in weights), default=0), dtype=torch.float32)


@dataclass(frozen=True)
class Stack:
    """One of vLLM's packed linear layers (`packed`) and the checkpoint weights stacked in it, top to bottom: its
    weight's parts and, where the checkpoint has them, its bias's."""

    layer: str
    weights: tuple[str, ...]
    biases: tuple[str, ...]


def packed(layer: torch.nn.Module | None) -> bool:
    """A plain linear layer vLLM's CPU build handed to its own kernel (oneDNN): an empty weight left in its place,
    the kernel rebuilt from a new weight by `process_weights_after_loading` (as vLLM's reload does). On a GPU the
    weight stays where it is (CUDA graphs hold it): not packed."""
    weight = getattr(layer, "weight", None)
    return (layer is not None and hasattr(layer, "cpu_linear") and isinstance(weight, torch.Tensor)
            and weight.numel() == 0 and getattr(layer, "tp_size", 1) == 1
            and type(getattr(layer, "quant_method", None)).__name__ == "UnquantizedLinearMethod")


def stacks(model: torch.nn.Module, base: dict[str, torch.Tensor]) -> tuple[list[Stack], list[str]]:
    """The packed layers of `model` that base weights fill whole, in a shape they fit (vLLM's fused layers, e.g.
    qkv_proj, stack the parts its `packed_modules_mapping` lists, in that order), and the base weights in none."""
    layers = {name: layer for name, layer in model.named_modules() if packed(layer)}
    fused = getattr(model, "packed_modules_mapping", None) or {}
    part_of = {part: (whole, index) for whole, parts in fused.items() for index, part in enumerate(parts)}
    found: dict[str, dict[str, dict[int, str]]] = {}
    for name in base:
        module, _, kind = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        whole, index = part_of.get(leaf, (leaf, 0)) if module not in layers else (leaf, 0)
        layer = ".".join(filter(None, (parent, whole)))
        if layer in layers and kind in ("weight", "bias"):
            found.setdefault(layer, {}).setdefault(kind, {})[index] = name
    placed = [stack for layer, kinds in found.items() if (stack := _stack(layers[layer], layer, kinds, fused, base))]
    inside = {name for stack in placed for name in (*stack.weights, *stack.biases)}
    return placed, [name for name in base if name not in inside]


def _stack(layer: torch.nn.Module, name: str, kinds: dict[str, dict[int, str]], fused: dict[str, list[str]],
           base: dict[str, torch.Tensor]) -> Stack | None:
    """The layer's Stack when the base holds every part of its weight (and all or none of its bias's), in the
    shape vLLM built it (its `output_sizes` and `input_size`); None otherwise."""
    count = len(fused.get(name.rpartition(".")[2], [None]))
    weights = tuple(kinds.get("weight", {}).get(index, "") for index in range(count))
    biases = tuple(kinds.get("bias", {}).get(index, "") for index in range(count)) if "bias" in kinds else ()
    if not all(weights) or not all(biases) or any(base[part].dim() != 2 for part in weights):
        return None
    rows = [base[part].shape[0] for part in weights]
    columns = {base[part].shape[1] for part in weights}
    sizes = list(getattr(layer, "output_sizes", None) or [getattr(layer, "output_size", sum(rows))])
    if len(columns) != 1 or sizes != rows or getattr(layer, "input_size", min(columns)) not in columns:
        return None
    return Stack(name, weights, biases)


class MergeExtension:
    """Mixed into vLLM's worker class by vLLM (`--worker-extension-cls`, `vllm_server.MERGE_EXTENSION`);
    `merge_adapter` is called through `/collective_rpc`."""

    model_runner: Any  # the worker's
    model_config: Any
    _tracegym_base_weights: tuple[Path, dict[str, torch.Tensor]]  # `_base_of`'s, set at the first merge

    def merge_adapter(self, adapter_path: str, base_path: str) -> int:
        """Serve the base weights in `base_path` with the adapter in `adapter_path` merged in; the number of
        weights reloaded."""
        base = _base_of(self, Path(base_path).resolve())
        adapter = read_adapter(Path(adapter_path))
        model = self.model_runner.get_model()
        checked = _check_served(model, base, adapter, Path(base_path).name)
        check_adapted(base, adapter)
        placed, rest = stacks(model, base)
        if set(rest) <= checked:
            return _install(self.model_runner, model, placed, base, adapter)
        log.info("merging adapters through vLLM's weight reload: %s is in no layer vLLM packs for the CPU",
                 next(name for name in rest if name not in checked))
        weights = merged(base, adapter, self.model_config.dtype)
        self.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        return len(base)


def _install(runner: Any, model: torch.nn.Module, placed: list[Stack], base: dict[str, torch.Tensor],
             adapter: Adapter) -> int:
    """Rebuild every packed layer in `placed` from its merged weight, written straight into one stacked tensor
    in the layer's dtype; then drop what vLLM derived from the old weights (as its reload does). The number of
    weights merged."""
    layers = dict(model.named_modules())
    scratch = scratch_for(base[name] for name in adapter.pairs)
    for stack in placed:
        layer = layers[stack.layer]
        if stack.biases:
            layer.bias.data.copy_(torch.cat([base[part] for part in stack.biases]))
        parts = [base[part] for part in stack.weights]
        weight = torch.empty(sum(part.shape[0] for part in parts), parts[0].shape[1], dtype=layer.weight.dtype)
        for rows, part, name in zip(weight.split([p.shape[0] for p in parts]), parts, stack.weights, strict=True):
            merge_into(rows, part, adapter.pairs.get(name), adapter.scaling, scratch)
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        layer.quant_method.process_weights_after_loading(layer)
    runner.reset_encoder_cache()
    runner.reset_mm_cache()
    return sum(len(stack.weights) for stack in placed)


def _base_of(worker: MergeExtension, path: Path) -> dict[str, torch.Tensor]:
    """The worker's base weights, read at its first merge (and again if another base is named). A function, not a
    method: vLLM offers every method of the extension as an RPC."""
    cached = getattr(worker, "_tracegym_base_weights", None)
    if cached is None or cached[0] != path:
        cached = (path, read_base(path))
        worker._tracegym_base_weights = cached
    return cached[1]


def _check_served(model: torch.nn.Module, base: dict[str, torch.Tensor], adapter: Adapter, folder: str) -> set[str]:
    """A ValueError when the weights vLLM serves are not the base's: those no adapter changes (norms, ...) that
    vLLM names as the checkpoint does must be equal; their names. (vLLM's error replies hide paths: the folder's
    last part.)"""
    params = dict(model.named_parameters())
    shared = [name for name in base if name not in adapter.pairs and name in params
              and params[name].shape == base[name].shape]
    differ = [name for name in shared if not torch.equal(params[name], base[name].to(params[name].dtype))]
    if differ:
        raise ValueError(f"this vLLM serves other weights than the base model in folder {folder!r} holds "
                         f"({len(differ)} of {len(shared)} unadapted weights differ, e.g. {differ[0]}): start vLLM "
                         f"from the trainer's base model to merge its adapters")
    return set(shared)
