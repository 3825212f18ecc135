"""Trainer: a transformers causal LM (LoRA through peft, or full weights) stepped by the policy-gradient loss.

`step(samples)` packs the samples into micro-batches by a token budget, accumulates the gradient of every
micro-batch (the loss divided by the step's loss tokens, so the split does not change it), clips it and takes
one AdamW step; the policy version goes up by one. `save_weights(dir)` writes what vLLM loads (a peft adapter
directory for LoRA, a model directory otherwise); `save(dir)` / `load(dir)` checkpoint everything a resumed
run needs to continue bit for bit: trainable weights, optimizer, version, RNG and the caller's own state.

Under `torchrun` the trainer is one of several ranks (`data_parallel`): the model is sharded over them, each rank
trains its token-balanced share of the step's samples, and the summed gradient is the one a single process would
get on the whole batch; like one process, each rank takes the logprobs straight from the last hidden states
(`lm_head`, `passing_through`) and never makes the [positions, vocabulary] logits. Checkpoints and served weights
hold full tensors written by rank 0, so a run saved at one world size resumes at any other.

A vision-language model (`train.image_inputs`) trains on samples with images: each micro-batch's images, read by
hash from the run folder, go through the model's vision tower and connector into the `<image>` tokens of their
runs; the LoRA adapter goes on the text tower (and on the connector's projection with `lora_projector`).

>>> trainer = build_trainer(TrainerConfig(model=str(embedded_model_dir())))  # doctest: +SKIP
>>> metrics = trainer.step(samples)  # doctest: +SKIP
>>> trainer.save_weights("outputs/adapters/step_1")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import math
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeGuard, cast

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor
from typing_extensions import TypeIs

from tracegym.core.errors import UsageError
from tracegym.core.sample import Sample
from tracegym.models.expert_routing import forced_routing
from tracegym.models.merge_extension import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from tracegym.train.batching import MicroBatch, balance, collate, idle, pack, rows
from tracegym.train.data_parallel import (
    CheckpointRows,
    DataParallel,
    full,
    full_optimizer_state,
    gathered,
    resolve_device,
    shard_like,
    sharded_optimizer_state,
)
from tracegym.train.image_inputs import (
    TRAINABLE_VLMS,
    ImageInputs,
    ImageSource,
    check_trainable,
    is_vlm,
    lora_targets,
)
from tracegym.train.lm_head import head_hits, head_logprobs
from tracegym.train.loss import LossConfig, cross_entropy_loss, policy_gradient_loss, token_hits, token_logprobs
from tracegym.train.malloc import Malloc
from tracegym.train.precision import ComputeDtype, compute_dtype

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedModel

LLAMA_LINEAR_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
WEIGHTS_FILE = "trainable.safetensors"
STATE_FILE = "trainer.pt"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".tmp")
PLAIN_HEADS = {"llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3", "olmo2"}
"""Model types whose logits are `lm_head(last hidden state)` and nothing more (no soft-capping or scaling)."""
COMPILED_MEMORY_BUDGET = 0.7
"""With `compile`: the share of the activations the eager backward would keep that the compiled one may keep
(`torch._functorch.config.activation_memory_budget`); it recomputes the rest, mostly pointwise ops. On
`benchmarks/trainer_step.py`'s batch, one run each: at 0.7 2.37 s and 1623 MB peak RSS, at 1.0 (keep all) 2.47 s
and 1842 MB, at 0.5 2.69 s and 1586 MB."""
LOSS_SUMS = ("loss", "tokens", "masked_low", "masked_high", "ratio", "abs_log_ratio", "correct")
"""The per-micro-batch sums a step adds up (over micro-batches, then over ranks, in this order)."""


class TrainerConfig(BaseModel):
    """The trainer's model, adapter, optimizer and loss settings."""

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())
    model: str
    """A Hugging Face model directory or hub name (the embedded model: `embedded_model_dir()`)."""
    lora: bool = True
    """Train a LoRA adapter (peft); False trains every weight."""
    lora_rank: int = 16
    """Adapter rank (vLLM must be started with `max_lora_rank` at least this)."""
    lora_alpha: int = 32
    """Adapter scale numerator (the update is scaled by alpha / rank)."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input."""
    lora_target_modules: list[str] = Field(default_factory=lambda: list(LLAMA_LINEAR_MODULES))
    """Linear layers that get an adapter (all of them in a Llama block by default); on a vision-language model,
    those of its text tower only."""
    lora_projector: bool = False
    """On a vision-language model: an adapter on the connector's projection too (vision features -> text
    embeddings). vLLM loads no adapter there: it needs `weight_sync = "merged"`."""
    learning_rate: float = 2e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Clip the gradient's global norm to this (0 disables clipping)."""
    micro_batch_tokens: int = 512
    """Padded tokens per micro-batch; gradients accumulate over micro-batches. Smaller ones use less memory and
    run a little slower (a reverse-text step on this CPU: 2.79 s and 1.48 GB peak RSS at 256, 2.42 s and 1.77 GB
    at 512; `benchmarks/trainer_step.py`)."""
    share_prompts: bool = True
    """Train the samples that share a prompt (a group's rollouts) in one row that holds the prompt once; the
    numbers are the same as with a row per sample, for fewer tokens (see `batching`)."""
    compute_dtype: ComputeDtype = "auto"
    """Dtype of the forward and backward matmuls (bfloat16 under autocast). `auto`: bfloat16 on a GPU and on a CPU
    with AMX, float32 on other CPUs (`precision.compute_dtype`). In bfloat16 a text model's LoRA trainer in one
    process keeps its frozen weights in bfloat16 (not cast again at every forward, half their memory; the LM head
    still gives logprobs straight from the hidden states) and its adapter, gradients and AdamW in float32; full
    weights, a vision-language model and a model sharded over ranks keep float32 weights. Measured with
    `benchmarks/trainer_step.py` (2 threads): on an AVX512-BF16 CPU without AMX, bfloat16 autocast made a
    reverse-text step 1.7x slower than float32 (6.8 s against 4.0 s); on an AMX CPU, bfloat16 autocast over
    float32 weights took 0.80x float32's time with 1.23x its peak RSS, bfloat16-stored frozen weights 0.59x
    with 0.75x (2.22 against 3.79 s, 1350 against 1794 MB), and with 256-token completions 0.77x with 0.84x
    (15.0 against 19.5 s, 1278 against 1527 MB)."""
    compile: bool = False
    """Compile each decoder layer (`torch.compile`, dynamic shapes), letting the compiler recompute cheap
    activations in the backward pass (`COMPILED_MEMORY_BUDGET`). A reverse-text step on this CPU: 2.45 s and
    1609 MB peak RSS against 2.78 s and 1784 MB eager (`benchmarks/trainer_step.py`), after ~25 s of compiling at
    the first step (~10 s from inductor's on-disk cache). One trainer process only; not with gradient
    checkpointing."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less trainer memory for more step time (a reverse-text step of
    a 135M model on this CPU: 1.21 GB peak RSS instead of 1.77 GB, 3.51 s instead of 2.42 s)."""
    malloc: Malloc = "tcmalloc"
    """The trainer process's memory allocator when `tracegym rl` starts it: tcmalloc where the machine has it
    (Debian: `libtcmalloc-minimal4`; else the system's), which made a reverse-text step 17% faster with 30% less
    peak memory than glibc's malloc, whose freed activations stay mapped (`train/malloc.py`)."""
    min_ratio: float = 0.125
    """Tokens whose trainer/sampler probability ratio is below this carry no gradient."""
    max_ratio: float = 8.0
    """Tokens whose trainer/sampler probability ratio is above this carry no gradient."""
    objective: Literal["policy_gradient", "cross_entropy"] = "policy_gradient"
    """What a step minimises: the policy-gradient loss (`rl`, `opd`) or the cross-entropy of the loss tokens
    (`sft`); `tracegym rl` sets it from `mode`."""
    num_threads: int | None = None
    """Torch CPU threads (per process); None leaves torch's default (`tracegym rl` on a CPU beside its own vLLM:
    half the cores, `launcher.with_cpu_threads`)."""
    num_processes: int = Field(default=1, ge=1)
    """Data-parallel trainer processes on this node (`tracegym rl` starts them under `torchrun`; on a GPU machine
    one per GPU). Each trains a token-balanced share of every step's samples on an FSDP-sharded model."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: `auto` takes a GPU where torch sees one (each rank its own), else the CPU."""
    seed: int = 0
    """Seeds the adapter's initialisation."""

    @model_validator(mode="after")
    def _compilable(self) -> TrainerConfig:
        if self.compile and self.num_processes > 1:
            raise ValueError("compile works with one trainer process (num_processes = 1)")
        if self.compile and self.gradient_checkpointing:
            raise ValueError("compile and gradient_checkpointing cannot both be on (compile saves memory itself)")
        return self


class Trainer:
    """Steps one model with AdamW on the policy-gradient loss; `version` counts the steps taken."""

    def __init__(self, model: PreTrainedModel | PeftModel, config: TrainerConfig, pad_id: int = 0,
                 dp: DataParallel | None = None, images: ImageInputs | None = None) -> None:
        """`dp`: this process's rank, when `model` is sharded over several (`make_trainer` shards it). `images`: a
        vision-language model's image processor and image source (samples with images need them)."""
        self.model = model
        self.images = images
        self.config = config
        self.pad_id = pad_id
        self.dp = dp or DataParallel()
        self.loss_config = LossConfig(min_ratio=config.min_ratio, max_ratio=config.max_ratio)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise UsageError("the model has no trainable parameters")
        self.dtype = compute_dtype(config.compute_dtype, self.dp.device)
        """The dtype of the matmuls (`compute_dtype`)."""
        self.stored_bfloat16 = (self.dtype == torch.bfloat16 and self.is_lora and self.dp.world == 1
                                and getattr(model.config, "model_type", None) not in TRAINABLE_VLMS)
        """Whether the frozen weights are kept in bfloat16 (cast once, here), so that autocast does not cast
        them again at every forward: a text model's LoRA trainer in one process (`save_merged` reads the
        checkpoint's weights by their names, which a vision-language model's may not keep)."""
        if self.stored_bfloat16:
            _store_frozen(model, torch.bfloat16)
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate, betas=config.betas,
                                           weight_decay=config.weight_decay)
        self.version = 0
        """The policy version of the current weights: steps taken since the start of the run."""
        self.head = self._plain_head()
        """The output embedding when logprobs come straight from the hidden states (`lm_head`), else None."""
        self._adapter_keys: dict[Path, dict[str, str] | None] = {}  # `save_weights`' folders: param -> file key
        if config.compile:
            compile_layers(self._causal_lm())

    @property
    def bfloat16(self) -> bool:
        """Whether matmuls run in bfloat16 (`compute_dtype`)."""
        return self.dtype == torch.bfloat16

    @property
    def is_lora(self) -> bool:
        return hasattr(self.model, "peft_config")

    def step(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One optimizer step on `samples` (every rank passes the whole step's samples and trains its share);
        returns the step's metrics."""
        if not samples:
            raise UsageError("a training step needs at least one sample")
        start = time.perf_counter()
        batches = self._micro_batches(samples)
        trained = len(batches)
        batches += [idle(self.pad_id).to(self.dp.device)] * (self.dp.max(trained) - trained)
        num_tokens = int(self.dp.sum([sum(b.num_loss_tokens for b in batches)])[0])
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(LOSS_SUMS, 0.0)
        for batch in batches:
            loss, stats = self._loss(batch, num_tokens)
            loss.backward()
            for name, value in {"loss": loss.item(), **stats}.items():
                sums[name] += value
        totals = self.dp.sum([*sums.values(), trained])
        grad_norm = self._clip()
        self.optimizer.step()
        self.version += 1
        step_sums = dict(zip(LOSS_SUMS, totals[:-1], strict=True))  # over every rank's micro-batches
        seconds = time.perf_counter() - start
        metrics = _metrics(step_sums, grad_norm, len(samples), int(totals[-1]), self.version, seconds)
        if self.config.objective == "cross_entropy":  # no sampler to compare with: a likelihood's own figures
            accuracy = step_sums["correct"] / max(step_sums["tokens"], 1.0)
            metrics = sft_metrics({**metrics, "token_accuracy": accuracy})
        return {**metrics, "ranks": float(self.dp.world)}

    def _micro_batches(self, samples: Sequence[Sample]) -> list[MicroBatch]:
        """This rank's micro-batches: its token-balanced share of `samples`, packed by the token budget."""
        laid_out = rows(samples, self.config.micro_batch_tokens, share=self.config.share_prompts)
        share = balance(laid_out, self.dp.world)[self.dp.rank]
        return [collate(group, self.pad_id).to(self.dp.device) for group in pack(share, self.config.micro_batch_tokens)]

    def _loss(self, batch: MicroBatch, num_tokens: int) -> tuple[torch.Tensor, dict[str, float]]:
        if self.config.objective == "cross_entropy":
            logprobs, hits = self._scored(batch, hits=True)
            return cross_entropy_loss(logprobs, batch.loss_mask, num_tokens, hits)
        return policy_gradient_loss(self._logprobs(batch), batch.sampler_logprobs, batch.advantages,
                                    batch.loss_mask, self.loss_config, num_tokens)

    def _logprobs(self, batch: MicroBatch) -> torch.Tensor:
        """[B, K] logprobs of the micro-batch's target tokens at each row's temperature."""
        return self._scored(batch)[0]

    def _scored(self, batch: MicroBatch, hits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`_logprobs`, and with `hits` whether each target is the position's most likely token ([B, K] bool)."""
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                  "position_ids": batch.position_ids, "use_cache": False}
        if batch.images:
            inputs = {**inputs, "input_ids": None, "inputs_embeds": self._embedded(batch)}
        if self.head is not None:
            hidden = self._hidden(batch, inputs, self.head)
            weight = _whole(self.head.weight)
            logprobs = head_logprobs(hidden, weight, batch.sources, batch.target_ids, batch.temperatures)
            return logprobs, head_hits(hidden, weight, batch.sources, batch.target_ids) if hits else None
        with self._autocast(batch), self._compiled(), self._replayed(batch):
            logits = self.model(**inputs, logits_to_keep=batch.keep).logits
        logprobs = token_logprobs(logits, batch.sources, batch.target_ids, batch.temperatures)
        return logprobs, token_hits(logits, batch.sources, batch.target_ids) if hits else None

    def _embedded(self, batch: MicroBatch) -> torch.Tensor:
        """The micro-batch's input embeddings with its images' features in their runs."""
        if self.images is None:
            raise UsageError(f"the samples carry images and model {self.config.model!r} takes text only")
        if self.dp.world > 1:
            raise UsageError("training on images runs in one trainer process (num_processes = 1)")
        return self.images.embedded(self._causal_lm(), batch.input_ids, batch.images)

    def _replayed(self, batch: MicroBatch) -> contextlib.AbstractContextManager[None]:
        """Where an MoE model routes each position to the experts its sampler chose (`models.expert_routing`), when the
        batch's samples recorded them."""
        if batch.routed_experts is None:
            return contextlib.nullcontext()
        return forced_routing(self._causal_lm(), batch.routed_experts)

    def _autocast(self, batch: MicroBatch) -> contextlib.AbstractContextManager[object]:
        """Where the model runs: under bfloat16 autocast when it computes in bfloat16 (which leaves the weights
        stored in bfloat16 as they are and casts the float32 ones, the adapter's)."""
        return torch.autocast(batch.input_ids.device.type, dtype=torch.bfloat16, enabled=self.bfloat16)

    def _compiled(self) -> contextlib.AbstractContextManager[object]:
        """Where compiled layers run (and compile, at a new shape): with their activation memory budget."""
        if not self.config.compile:
            return contextlib.nullcontext()
        return torch._functorch.config.patch(activation_memory_budget=COMPILED_MEMORY_BUDGET)

    def _causal_lm(self) -> PreTrainedModel:
        """The transformers model under peft's wrapper (if any)."""
        if _peft(self.model):
            return cast("PreTrainedModel", self.model.get_base_model())  # peft types it as a torch Module
        return self.model

    def _hidden(self, batch: MicroBatch, inputs: dict[str, Any], head: torch.nn.Module) -> torch.Tensor:
        """The last hidden states at the kept positions. One process runs the decoder alone (7-10% faster a 48-token
        step than the whole model with its head passing through, measured in `benchmarks/rl_step_vs_trl.md`); ranks
        that share the model run the model's own forward, so FSDP gathers and releases its weights as it always does."""
        if self.dp.world == 1:
            with self._autocast(batch), self._compiled(), self._replayed(batch):
                return self._causal_lm().get_decoder()(**inputs).last_hidden_state[:, -batch.keep:]
        with self._autocast(batch), self._compiled(), self._replayed(batch), passing_through(head):
            return self.model(**inputs, logits_to_keep=batch.keep).logits

    def _plain_head(self) -> torch.nn.Linear | None:
        """The output embedding, when logprobs may come straight from the hidden states (`lm_head`): a frozen
        linear layer without bias that the model applies as it is, stored in the dtype it computes in (not under
        autocast)."""
        causal = self._causal_lm()
        head = causal.get_output_embeddings()
        plain = (type(head) is torch.nn.Linear and head.bias is None and not head.weight.requires_grad
                 and _head_type(causal.config) in PLAIN_HEADS)
        return head if plain and (self.stored_bfloat16 or not self.bfloat16) else None

    def _clip(self) -> float:
        """Clip the gradient (when enabled) and return its norm before clipping."""
        limit = self.config.max_grad_norm if self.config.max_grad_norm > 0 else float("inf")
        return float(full(torch.nn.utils.clip_grad_norm_(self.params, limit)))

    @torch.no_grad()
    def logprobs(self, samples: Sequence[Sample]) -> list[list[float]]:
        """The trainer's logprob of every loss token of each sample (0.0 elsewhere), at the sample's temperature."""
        self.model.eval()
        out = {id(s): [0.0] * len(s) for s in samples}
        laid_out = rows(samples, self.config.micro_batch_tokens, share=self.config.share_prompts)
        for group in pack(laid_out, self.config.micro_batch_tokens):  # every rank runs all: the forwards are collective
            batch = collate(group, self.pad_id).to(self.dp.device)
            values = torch.where(batch.loss_mask, self._logprobs(batch), 0.0).tolist()
            for span in batch.spans:
                taken = values[span.row][span.column:span.column + span.count]
                out[id(span.sample)][span.first:span.first + span.count] = taken
        return [out[id(s)] for s in samples]

    # --- weights and checkpoints -------------------------------------------------------------------------
    def save_weights(self, path: str | Path) -> Path:
        """Write what vLLM serves: the adapter directory (LoRA) or the model directory (full weights). With several
        ranks every rank calls it (the weights are gathered) and rank 0 writes. A LoRA adapter saved again into a
        folder this trainer wrote whole (its config does not change) rewrites only its weights file, with the keys
        peft wrote (checked at that first save): 0.02 s instead of peft's 0.06 s for SmolLM2-135M at r=16."""
        path = Path(path)
        with gathered(self.model):
            if self.dp.main:
                path.mkdir(parents=True, exist_ok=True)
                keys = self._adapter_keys.get(path)
                if keys is not None and (path / ADAPTER_CONFIG).is_file():
                    params = dict(self.model.named_parameters())
                    save_file({key: params[name].detach() for name, key in keys.items()},
                              str(path / ADAPTER_WEIGHTS), metadata={"format": "pt"})
                    return path
                # a sharded model's state_dict() holds shards even while gathered: hand over the whole parameters
                whole: dict[str, Any] = {"state_dict": dict(self.model.named_parameters())} if self.dp.world > 1 else {}
                self.model.save_pretrained(str(path), **whole)
                plain = self.is_lora and self.dp.world == 1
                self._adapter_keys[path] = adapter_keys(self.model, path) if plain else None
        return path

    def save_merged(self, path: str | Path, dtype: torch.dtype = torch.bfloat16, changed_only: bool = False) -> Path:
        """Write the full weights with the adapter merged in (`model.safetensors`, checkpoint names), for a vLLM
        that reloads its base weights in place. Each LoRA delta is added to a copy, so the base weights stay
        bit-identical (peft's merge then unmerge would round them a little every step). `changed_only` (LoRA):
        leave out the embeddings no adapter touches (a fifth of a small model's bytes), for a vLLM that holds
        them already and reloads the rest; every other weight is written, so each of vLLM's fused projections
        (qkv, gate_up) is reloaded whole whichever of its parts the adapter targets."""
        path = Path(path)
        with torch.no_grad(), gathered(self.model), self._float32_weights() as base:
            if self.dp.main:
                path.mkdir(parents=True, exist_ok=True)
                layers = _lora_layers(self.model) if self.is_lora else {}
                kept = _frozen_embeddings(self.model, layers) if changed_only else set()
                weights = {_checkpoint_name(n): _merged(base(n, p), layers.get(n)).to(dtype).contiguous().cpu()
                           for n, p in self.model.named_parameters() if "lora_" not in n and n not in kept}
                tmp = path / "model.safetensors.tmp"
                save_file(weights, str(tmp))
                tmp.replace(path / "model.safetensors")
                copy_model_files(Path(self.config.model), path)  # servable on its own, e.g. as a teacher
        return path

    @contextlib.contextmanager
    def _float32_weights(self) -> Iterator[Callable[[str, torch.Tensor], torch.Tensor]]:
        """Inside: a named parameter's float32 value to merge an adapter into. Frozen weights kept in bfloat16 are
        read from the model's checkpoint instead, so that a merged weight is `W + delta` rounded once, the bits
        vLLM's own merge serves (`merge_extension`), and a delta below half a bfloat16 step still moves it."""
        if not self.stored_bfloat16:
            yield lambda name, param: param.detach()
            return
        with CheckpointRows(_local_folder(self.config.model)) as checkpoint:

            def value(name: str, param: torch.Tensor) -> torch.Tensor:
                key = _checkpoint_name(name)
                if param.requires_grad:
                    return param.detach()
                if key not in checkpoint:
                    raise UsageError(f"model {self.config.model!r}: its checkpoint has no weight {key!r} to merge into")
                return checkpoint.read(key, slice(None)).float()

            yield value

    def save(self, path: str | Path, extra_state: dict[str, Any] | None = None) -> Path:
        """Checkpoint trainable weights, optimizer, version, RNG and `extra_state` (e.g. advantage state), as full
        tensors whatever the world size. With several ranks every rank calls it and rank 0 writes."""
        path = Path(path)
        trainable = {n: full(p.detach()).contiguous().cpu() for n, p in self.model.named_parameters()
                     if p.requires_grad}
        optimizer = full_optimizer_state(self.optimizer.state_dict())
        if self.dp.main:
            path.mkdir(parents=True, exist_ok=True)
            save_file(trainable, str(path / WEIGHTS_FILE))
            state = {"version": self.version, "optimizer": optimizer, "rng": torch.get_rng_state(),
                     "config": self.config.model_dump(mode="json"), "extra": extra_state or {}}
            torch.save(state, path / STATE_FILE)
        if self.is_lora:
            self.save_weights(path / "adapter")
        return path

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore a checkpoint written by `save`; returns its `extra_state`."""
        path = Path(path)
        if not (path / STATE_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
            raise UsageError(f"{path} is not a trainer checkpoint (no {STATE_FILE} / {WEIGHTS_FILE})")
        weights = load_file(str(path / WEIGHTS_FILE))
        params = dict(self.model.named_parameters())
        missing = [n for n, p in params.items() if p.requires_grad and n not in weights]
        if missing or any(n not in params for n in weights):
            raise UsageError(f"checkpoint {path} does not match the model (missing {missing[:3]} ...)")
        with torch.no_grad():
            for name, value in weights.items():
                params[name].copy_(shard_like(value, params[name]))
        state = torch.load(path / STATE_FILE, weights_only=False)
        self.optimizer.load_state_dict(sharded_optimizer_state(state["optimizer"], self.params))
        torch.set_rng_state(state["rng"])
        self.version = int(state["version"])
        return dict(state["extra"])


@contextlib.contextmanager
def passing_through(head: torch.nn.Module) -> Iterator[None]:
    """Inside: `head` returns (a copy of) its input, so the model's forward returns the last hidden states (at the
    kept positions) as its "logits" and no [positions, vocabulary] tensor is made. The model runs its own forward,
    so a sharded model gathers and releases its weights as it always does."""
    head.__dict__["forward"] = _unchanged  # an instance attribute: nn.Module's call finds it before the class's
    try:
        yield
    finally:
        del head.__dict__["forward"]


def _local_folder(model: str) -> Path:
    """The folder of `model`'s files: itself, or a hub model's downloaded snapshot."""
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(model, local_files_only=True))
    except LocalEntryNotFoundError:
        raise UsageError(f"trainer.model {model!r} is neither a folder nor a downloaded hub model: no checkpoint "
                         "to merge the adapter into") from None


def _store_frozen(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Keep `model`'s frozen floating-point parameters in `dtype` (in place; trainable ones stay as they are), and
    let its LoRA layers pass their `dtype` activations to the adapter as they are: peft would cast them to the
    adapter's float32 (and its output back), where autocast runs the adapter's matmuls in `dtype` from its
    float32 weights. On `benchmarks/trainer_step.py`'s 48-token step (AMX CPU) peft's casts took 0.16 s more of
    copying and 180 MB more peak RSS (1681 against 1502 MB)."""
    with torch.no_grad():
        for param in model.parameters():
            if not param.requires_grad and param.is_floating_point():
                param.data = param.data.to(dtype)
    for module in model.modules():
        if _is_lora_layer(module):
            module.cast_input_dtype_enabled = False  # what peft.helpers.disable_input_dtype_casting sets


def _whole(weight: torch.Tensor) -> torch.Tensor:
    """The output embedding's weight, read right after the model's forward: whole there also when the model is
    sharded over several ranks. It belongs to FSDP's root unit, which gathers its weights in the forward and keeps
    them gathered until that forward's backward has gone through the root (FSDP2 does not reshard the root after
    its forward), so the head's own backward, which runs first, finds it whole too."""
    if isinstance(weight, DTensor):
        raise RuntimeError("the output embedding is still sharded after the model's forward (FSDP resharded its "
                           "root unit after the forward)")
    return weight


def _unchanged(hidden: torch.Tensor) -> torch.Tensor:
    return hidden.clone()  # the kept positions are a view; FSDP warns of a view as a sharded model's output


def copy_model_files(source: Path, target: Path) -> None:
    """Copy the model directory `source`'s config and tokenizer files (every file but weights) into `target`
    where missing, so that merged weights there load on their own (vLLM, transformers)."""
    if not source.is_dir():
        return  # a hub id: its files are not here to copy
    for file in source.iterdir():
        weights = file.name.endswith(WEIGHT_SUFFIXES) or ".index." in file.name or file.name.startswith(".")
        if file.is_file() and not weights and not (target / file.name).exists():
            shutil.copyfile(file, target / file.name)


def checkpoint_extra_state(path: str | Path) -> dict[str, Any]:
    """The `extra_state` a checkpoint was saved with, read without a model (by a process that has none, e.g.
    the orchestrator's); the rest of the file is mapped, not read."""
    state_file = Path(path) / STATE_FILE
    if not state_file.is_file():
        raise UsageError(f"{path} is not a trainer checkpoint (no {STATE_FILE})")
    return dict(torch.load(state_file, weights_only=False, mmap=True)["extra"])


def _metrics(sums: dict[str, float], grad_norm: float, samples: int, batches: int, version: int,
             seconds: float) -> dict[str, float]:
    """The step's metrics from the micro-batches' summed loss statistics."""
    tokens = max(sums.get("tokens", 0.0), 1.0)
    kept = max(tokens - sums.get("masked_low", 0.0) - sums.get("masked_high", 0.0), 1.0)
    return {
        "loss": sums.get("loss", 0.0),
        "grad_norm": grad_norm,
        "tokens": sums.get("tokens", 0.0),
        "masked_low_frac": sums.get("masked_low", 0.0) / tokens,
        "masked_high_frac": sums.get("masked_high", 0.0) / tokens,
        "ratio_mean": sums.get("ratio", 0.0) / kept,
        "abs_log_ratio_mean": sums.get("abs_log_ratio", 0.0) / tokens,
        "samples": float(samples),
        "micro_batches": float(batches),
        "version": float(version),
        "seconds": seconds,
    }


RATIO_METRICS = ("masked_low_frac", "masked_high_frac", "ratio_mean", "abs_log_ratio_mean")
"""The policy-gradient loss's figures of the trainer-sampler ratio, which a cross-entropy step has not."""


def sft_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """A cross-entropy step's metrics: its loss is the mean NLL of the loss tokens, `perplexity` its exp (and
    `token_accuracy`, when given, the share of loss tokens that are their position's most likely token); the
    ratio figures, which it has not, are left out (not logged as 0)."""
    out = {k: v for k, v in metrics.items() if k not in RATIO_METRICS}
    return {**out, "perplexity": math.exp(min(metrics["loss"], 700.0))}


def _head_type(config: Any) -> str | None:
    """The model type whose head makes the logits: a vision-language model's text tower's (`image_inputs`)."""
    kind = getattr(config, "model_type", None)
    text = getattr(config, "text_config", None) if kind in TRAINABLE_VLMS else None
    return getattr(text, "model_type", None) if text is not None else kind


def _peft(model: PreTrainedModel | PeftModel) -> TypeIs[PeftModel]:
    """Whether `model` is under peft's wrapper (`Trainer.is_lora`)."""
    return hasattr(model, "peft_config")


class _LoraMatrix(Protocol):
    weight: torch.Tensor


class _LoraLayer(Protocol):
    """What `_merged` and `_store_frozen` use of a peft LoRA layer (torch's stubs type a Module's undeclared
    attributes as Tensor | Module)."""

    active_adapters: list[str]
    lora_A: Mapping[str, _LoraMatrix]
    lora_B: Mapping[str, _LoraMatrix]
    scaling: dict[str, float]
    cast_input_dtype_enabled: bool  # whether peft casts the adapter's input to its dtype (`_store_frozen`)

    def get_delta_weight(self, adapter: str) -> torch.Tensor: ...


def _is_lora_layer(module: torch.nn.Module) -> TypeGuard[_LoraLayer]:
    return getattr(module, "base_layer", None) is not None and hasattr(module, "get_delta_weight")


def _lora_layers(model: torch.nn.Module) -> dict[str, _LoraLayer]:
    """`<layer>.base_layer.weight` parameter name -> its peft LoRA layer."""
    return {f"{name}.base_layer.weight": module for name, module in model.named_modules() if _is_lora_layer(module)}


def _frozen_embeddings(model: PreTrainedModel | PeftModel, layers: dict[str, _LoraLayer]) -> set[str]:
    """Names of the input / output embedding parameters that neither train nor carry an adapter."""
    ids = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
           for p in m.parameters()}
    return {n for n, p in model.named_parameters() if id(p) in ids and not p.requires_grad and n not in layers}


def _merged(weight: torch.Tensor, layer: _LoraLayer | None) -> torch.Tensor:
    """`weight` plus the deltas of the layer's active adapters, in a new tensor (one layer at a time, so the
    extra memory is one layer's, not the model's)."""
    if layer is None:
        return weight
    out = weight
    for adapter in layer.active_adapters:
        if adapter not in getattr(layer, "lora_A", {}):
            continue
        if _plain_linear(layer, adapter, weight):  # W + s * B @ A in one pass: 3x faster than peft's delta + add
            a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            out = torch.addmm(out, b.to(weight.dtype), a.to(weight.dtype), alpha=layer.scaling[adapter])
        else:
            out = out + layer.get_delta_weight(adapter).to(weight.dtype)
    return out if out is not weight else weight.clone()


def _plain_linear(layer: _LoraLayer, adapter: str, weight: torch.Tensor) -> bool:
    """A LoRA on a 2-D linear weight without DoRA or a transposed layout, whose delta is `scaling * B @ A`."""
    return (weight.dim() == 2 and not getattr(layer, "fan_in_fan_out", False)
            and not getattr(layer, "use_dora", {}).get(adapter, False)
            and isinstance(getattr(layer.lora_A[adapter], "weight", None), torch.Tensor)
            and layer.lora_A[adapter].weight.dim() == 2)


def _checkpoint_name(name: str) -> str:
    """A peft parameter name as the base model's checkpoint names it."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def adapter_keys(model: torch.nn.Module, folder: Path) -> dict[str, str] | None:
    """Each trainable parameter's key in the adapter peft wrote into `folder` (its name less the adapter's, as
    peft saves plain LoRA), or None when the file holds other keys (DoRA, saved modules, embeddings, ...)."""
    from safetensors import safe_open

    keys = {name: name.replace(".default", "") for name, param in model.named_parameters() if param.requires_grad}
    with safe_open(str(folder / ADAPTER_WEIGHTS), framework="pt") as handle:
        written = set(handle.keys())
    return keys if set(keys.values()) == written and len(written) == len(keys) else None


def apply_lora(model: torch.nn.Module, config: TrainerConfig) -> PeftModel:
    """`model` wrapped by peft with a fresh LoRA adapter (only the adapter trains)."""
    from peft import LoraConfig, get_peft_model

    targets = lora_targets(model, config.lora_target_modules, config.lora_projector)
    lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def build_trainer(config: TrainerConfig, dp: DataParallel | None = None, images: ImageSource | None = None,
                  ) -> Trainer:
    """Load `config.model` in float32 and make its Trainer (`make_trainer`) on `dp`'s rank (default: alone).
    `images`: where a vision-language model's images are read by hash (`image_inputs.folder_source`)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    dp = dp or DataParallel(device=resolve_device(config.device))
    vlm = is_vlm(config.model)
    if vlm and dp.world > 1:
        raise UsageError(f"model {config.model!r} takes images: it trains in one trainer process (num_processes = 1)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(config.model)
        if dp.world > 1:  # each rank reads only its shards of the weights
            return Trainer(sharded_model(config, dp), config, pad_id=_pad_id(tokenizer), dp=dp)
        loader = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
        model = loader.from_pretrained(config.model, dtype=torch.float32)
    except OSError as exc:
        raise UsageError(f"cannot load model {config.model!r}: {exc}") from None
    inputs = None
    if vlm:
        check_trainable(model.config)
        inputs = ImageInputs.load(config.model, images or _no_images)
    return make_trainer(model, config, _pad_id(tokenizer), dp, inputs)


def _no_images(sha256: str) -> bytes:
    raise ValueError(f"image {sha256}: this trainer was given no run folder to read images from")


def _pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def sharded_model(config: TrainerConfig, dp: DataParallel) -> PreTrainedModel | PeftModel:
    """`config.model` prepared as `make_trainer` does and sharded over `dp`'s ranks, built on the meta device
    and then filled shard by shard: each rank reads only its rows of every weight from the folder's safetensors,
    and draws the LoRA adapter's initial values (the same on every rank: the seed is set) whole, then keeps its
    rows. So no rank holds the whole model at any time."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config.model), dtype=torch.float32)
    model.tie_weights()
    with CheckpointRows(config.model) as weights:

        def fill(name: str, shape: torch.Size, part: slice) -> torch.Tensor:
            key = _checkpoint_name(name)
            if key in weights:
                return weights.read(key, part)
            if ".lora_A." in name:  # peft's default initialisation (init_lora_weights=True)
                return torch.nn.init.kaiming_uniform_(torch.empty(shape), a=math.sqrt(5))[part]
            if ".lora_B." in name:
                return torch.zeros(shape)[part]
            raise UsageError(f"model {config.model!r}: its checkpoint has no weight {key!r}")

        return dp.shard_empty(prepare_model(model, config), fill)


def make_trainer(model: PreTrainedModel | PeftModel, config: TrainerConfig, pad_id: int = 0,
                 dp: DataParallel | None = None, images: ImageInputs | None = None) -> Trainer:
    """The Trainer of a loaded float32 `model`: gradient checkpointing and a LoRA adapter as `config` says, on
    `dp`'s device and sharded over its ranks (every rank passes the same model, e.g. loaded with the same seed).
    `images`: a vision-language model's image inputs."""
    dp = dp or DataParallel()
    return Trainer(dp.shard(prepare_model(model, config)), config, pad_id=pad_id, dp=dp, images=images)


def prepare_model(model: PreTrainedModel | PeftModel, config: TrainerConfig) -> PreTrainedModel | PeftModel:
    """`model` with gradient checkpointing and a LoRA adapter as `config` says."""
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not config.lora:
        return model
    adapted = apply_lora(model, config)
    if config.gradient_checkpointing:
        adapted.enable_input_require_grads()  # frozen embeddings: let checkpointed blocks see a grad input
    return adapted


def compile_layers(causal: PreTrainedModel) -> None:
    """Compile each decoder layer of a transformers causal LM in place, for any sequence length (each compiles
    at its first forward)."""
    layers = getattr(causal.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise UsageError(f"trainer.compile needs a model whose decoder keeps its blocks in `layers`; "
                         f"{type(causal).__name__}'s does not")
    for layer in layers:
        layer.compile(dynamic=True)
