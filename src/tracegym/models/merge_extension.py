"""Merge extension: a method vLLM's workers gain (`--worker-extension-cls`) to serve a LoRA adapter merged into
their base weights in place, read from the adapter's folder with no full-weights file in between.

`MergedWeightSync` calls `merge_adapter` through vLLM's `/collective_rpc` (dev mode) with the adapter's folder and
the base model's. The first call reads the base checkpoint's weights, all but the input and output embeddings no
adapter touches, and keeps them in the worker as stored (SmolLM2-135M: 0.42 GB of float32; kept as stored so that
a small update still moves a bfloat16 weight across a rounding step). Each call checks that vLLM serves that base
(the weights no adapter changes are equal), computes `W + s * B @ A` in float32 for every adapted weight, exactly
as `Trainer.save_merged` does (so vLLM serves the same bits either way), and hands every kept weight to vLLM's own
in-place reload, which restacks its fused projections (qkv, gate_up) and redoes what it derives from them. The
trainer writes its 20 MB adapter, not 210 MB of merged weights (`benchmarks/weight_sync.py`).

>>> VLLMServerConfig(model=path, merge_adapters=True)  # doctest: +SKIP
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
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
    missing = sorted(set(adapter.pairs) - set(base))
    if missing:
        raise ValueError(f"the adapter adapts weights the base checkpoint does not hold (or embeddings): {missing[:3]}")
    for name, weight in base.items():
        pair = adapter.pairs.get(name)
        out = weight.dtype if dtype is None else dtype
        if pair is None:
            yield name, weight.to(out)
            continue
        a, b = pair
        yield name, torch.addmm(weight.float(), b.float(), a.float(), alpha=adapter.scaling).to(out)


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
        _check_served(self.model_runner.get_model(), base, adapter, Path(base_path).name)
        weights = merged(base, adapter, self.model_config.dtype)
        self.model_runner.reload_weights(weights_iterator=weights, is_checkpoint_format=True)
        return len(base)


def _base_of(worker: MergeExtension, path: Path) -> dict[str, torch.Tensor]:
    """The worker's base weights, read at its first merge (and again if another base is named). A function, not a
    method: vLLM offers every method of the extension as an RPC."""
    cached = getattr(worker, "_tracegym_base_weights", None)
    if cached is None or cached[0] != path:
        cached = (path, read_base(path))
        worker._tracegym_base_weights = cached
    return cached[1]


def _check_served(model: torch.nn.Module, base: dict[str, torch.Tensor], adapter: Adapter, folder: str) -> None:
    """A ValueError when the weights vLLM serves are not the base's: those no adapter changes (norms, ...) that
    vLLM names as the checkpoint does must be equal. (vLLM's error replies hide paths: the folder's last part.)"""
    params = dict(model.named_parameters())
    shared = [name for name in base if name not in adapter.pairs and name in params
              and params[name].shape == base[name].shape]
    differ = [name for name in shared if not torch.equal(params[name], base[name].to(params[name].dtype))]
    if differ:
        raise ValueError(f"this vLLM serves other weights than the base model in folder {folder!r} holds "
                         f"({len(differ)} of {len(shared)} unadapted weights differ, e.g. {differ[0]}): start vLLM "
                         f"from the trainer's base model to merge its adapters")
