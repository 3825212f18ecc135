"""Embedded MoE model: a tiny Qwen3-MoE of seeded random layers on the embedded SmolLM2's tokenizer and embeddings."""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tracegym.core.errors import UsageError
from tracegym.models.embedded import built_once, cache_root, embedded_model_dir

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


@dataclass(frozen=True)
class MoeShape:
    """The tiny model's shape: small enough for fast CPU tests, an MoE architecture vLLM serves on CPU."""

    num_hidden_layers: int = 2
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 256
    init_std: float = 0.05
    """Standard deviation of the random layers' weights: large enough that attention and experts move the
    residual stream away from the input embedding (so a flipped expert shows in the logprobs)."""
    head_std: float = 0.14
    """Standard deviation of the untied random output head: ~3 nats of next-token entropy. (A head tied to the
    dense embeddings predicts the input token again, and sampling collapses onto one repeated token.)"""
    seed: int = 0

    @property
    def name(self) -> str:
        """The cache folder name: one folder per shape."""
        return (f"tiny-qwen3-moe-l{self.num_hidden_layers}-e{self.num_experts}-k{self.num_experts_per_tok}"
                f"-i{self.moe_intermediate_size}-w{self.init_std:g}-h{self.head_std:g}-s{self.seed}")


def default_moe_dir(shape: MoeShape) -> Path:
    """Where the tiny MoE lives: `cache_root()/models/<shape name>`."""
    return cache_root() / "models" / shape.name


def embedded_moe_dir(shape: MoeShape | None = None, cache_dir: str | Path | None = None) -> Path:
    """The tiny MoE as a Hugging Face directory, made once (`built_once`)."""
    shape = shape or MoeShape()
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_moe_dir(shape)
    return built_once(target, lambda build: build_moe(shape, build), shape.name)


def moe_config(shape: MoeShape, dense: dict[str, Any]) -> Any:
    """A Qwen3-MoE config with the dense embedded model's vocabulary, width and attention, and `shape`'s experts."""
    from transformers import Qwen3MoeConfig

    keep = ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
            "bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings", "rope_parameters")
    moe = {k: v for k, v in asdict(shape).items() if k not in ("seed", "init_std", "head_std")}
    return Qwen3MoeConfig(**{k: dense[k] for k in keep if k in dense}, **moe, tie_word_embeddings=False,
                          initializer_range=shape.init_std,
                          intermediate_size=moe["moe_intermediate_size"], norm_topk_prob=True,
                          decoder_sparse_step=1, mlp_only_layers=[], architectures=["Qwen3MoeForCausalLM"])


def build_moe(shape: MoeShape, out_dir: Path) -> None:
    """Write the tiny MoE into `out_dir`: seeded random layers, the dense model's embeddings, its tokenizer."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        raise UsageError(f"building the embedded MoE needs torch and transformers: {exc}") from exc
    dense_dir = embedded_model_dir()
    dense = AutoModelForCausalLM.from_pretrained(dense_dir, dtype=torch.float32)
    torch.manual_seed(shape.seed)
    model = AutoModelForCausalLM.from_config(moe_config(shape, dense.config.to_dict()), dtype=torch.float32)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(dense.get_input_embeddings().weight)
        model.get_output_embeddings().weight.normal_(0.0, shape.head_std)
    model.generation_config = dense.generation_config
    model.save_pretrained(out_dir)
    for name in TOKENIZER_FILES:
        shutil.copy(dense_dir / name, out_dir / name)
