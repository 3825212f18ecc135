"""Data parallelism: the trainer's ranks (one process, or several started by `torchrun`), the model sharded across
them with FSDP2 (`torch.distributed.fsdp.fully_shard`), and the few collectives a training step needs.

One process is the world of size 1: nothing is sharded and every collective returns its input, so the trainer
runs the same code either way. Several processes join one process group (`gloo` on CPU, `nccl` on GPU, chosen by
what this machine has); each decoder block and then the whole model are sharded (FSDP2 runs on CPU with gloo in
this torch, so FSDP1's flat parameters, which mix badly with LoRA's frozen weights, are not needed). Gradients are
summed across ranks, not averaged: the loss is already divided by the whole step's loss tokens.

A trainer built from a model folder at several ranks (`trainer.build_trainer`) never holds the whole model: it is
built on the meta device, sharded, and only then allocated, each rank reading only its rows of every weight from the
folder's safetensors (`DataParallel.shard_empty`, `CheckpointRows`); LoRA and full fine-tuning alike (FSDP2 shards
frozen and trained parameters the same way). A model handed over already loaded (`make_trainer`) is sharded as it
is. One process builds and loads it as before.

Checkpoints and served weights hold full tensors: `full` gathers a sharded one (every rank must call it, in the
same order), `shard_like` cuts a full one down to what this rank holds, so a checkpoint saved at any world size
loads at any other.

>>> dp = join()  # under torchrun: this rank of WORLD_SIZE; otherwise the world of one  # doctest: +SKIP
>>> model = dp.shard(model)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

COLLECTIVE_TIMEOUT = datetime.timedelta(hours=2)
"""How long a rank waits in a collective for the others: longer than the trainer waits for a batch (an hour),
so a slow orchestrator is never mistaken for a dead rank; a rank that dies ends the others through torchrun."""
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


@dataclass(frozen=True)
class DataParallel:
    """This process's place among the trainer's ranks (rank 0 of 1 when it trains alone)."""

    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where this rank's model and micro-batches live (`cuda:LOCAL_RANK` on a GPU machine)."""

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes metrics, checkpoints and served weights, and publishes them."""
        return self.rank == 0

    def sum(self, values: Sequence[float]) -> list[float]:
        """`values` summed over every rank (each rank passes as many, in the same order)."""
        if self.world == 1:
            return [float(v) for v in values]
        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor)
        return tensor.tolist()

    def max(self, value: int) -> int:
        """The largest `value` any rank passed."""
        if self.world == 1:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def barrier(self) -> None:
        """Wait until every rank got here."""
        if self.world > 1:
            dist.barrier()

    def shard(self, model: ModuleT) -> ModuleT:
        """`model` on this rank's device, sharded over the ranks (each block the model names as unsplittable,
        then the rest), with gradients summed rather than averaged; the model itself when training alone."""
        model = model.to(self.device)
        return model if self.world == 1 else self._fully_shard(model)

    def shard_empty(self, model: ModuleT, fill: Callable[[str, torch.Size, slice], torch.Tensor]) -> ModuleT:
        """`model`, built with its parameters on the meta device (its buffers real), sharded over the ranks and
        only then allocated on this rank's device, each parameter's share filled with `fill(name, shape, rows)`:
        the rows `rows` of the whole parameter `name` (of `shape`). No rank ever holds the whole model."""
        sharded = self._fully_shard(model) if self.world > 1 else model
        buffers = {name: buffer.clone() for name, buffer in sharded.named_buffers() if not buffer.is_meta}
        tied = _tied_parameters(sharded)
        sharded.to_empty(device=self.device)
        for (first, name), *others in tied:  # to_empty makes a tensor per module, untying shared ones
            for module, other in others:
                setattr(module, other, getattr(first, name))
        with torch.no_grad():
            for name, buffer in buffers.items():
                sharded.get_buffer(name).copy_(buffer)
            for name, param in sharded.named_parameters():
                local = param.to_local() if isinstance(param, DTensor) else param
                local.copy_(fill(name, param.shape, self.rows(param)))
        return sharded

    def rows(self, param: torch.Tensor) -> slice:
        """The rows (first dimension) of the whole parameter that this rank's shard of `param` holds (FSDP2 cuts
        each into `world` equal chunks, the last ones shorter or empty)."""
        length = param.shape[0] if param.dim() else 1
        if not isinstance(param, DTensor):
            return slice(0, length)
        chunk = -(-length // self.world)
        start = min(self.rank * chunk, length)
        return slice(start, min(start + chunk, length))

    def _fully_shard(self, model: ModuleT) -> ModuleT:
        """`model` sharded over the ranks in place (see `shard`)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        mesh = init_device_mesh(self.device.type, (self.world,))
        blocks = set(_unsplittable(model))
        for module in [m for m in model.modules() if type(m).__name__ in blocks]:
            fully_shard(module, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)
                module.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        return model

    def close(self) -> None:
        """Leave the process group once every rank is done (a rank that left while rank 0 still wrote its last
        files could take the group's connections down under it)."""
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()


def join(device: str = "auto") -> DataParallel:
    """This process's rank: under `torchrun` (WORLD_SIZE > 1) it joins the process group (`nccl` where this
    rank has a GPU, else `gloo`); otherwise it trains alone. `device`: `cpu`, `cuda`, or `auto` (a GPU if any)."""
    world = launched_world()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    target = resolve_device(device, local_rank)
    if target.type == "cuda":
        torch.cuda.set_device(target)
    if world == 1:
        return DataParallel(device=target)
    backend = "nccl" if target.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT, device_id=target if backend == "nccl" else None)
    return DataParallel(rank=dist.get_rank(), world=dist.get_world_size(), device=target)


def launched_world() -> int:
    """How many ranks `torchrun` started this run with (1 when this process was not started by it)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def exit_process(code: int) -> NoReturn:
    """End this process with exit status `code`. One rank of several skips the interpreter's shutdown: gloo's
    worker threads may still be releasing the last collective's tensors, which takes the GIL, and a thread that
    asks for it while the interpreter shuts down aborts the whole process (SIGABRT, "terminate called without an
    active exception": pytorch/pytorch#179291), which would turn a finished run into a failed one. Whatever a
    rank must leave behind is written by then; the standard streams and log handlers are flushed here."""
    if launched_world() == 1:
        sys.exit(code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """`auto`: this rank's GPU where torch sees one, else the CPU; `cuda`: this rank's GPU (an error without one)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' asked for, but torch sees no GPU")
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device(device)


class CheckpointRows:
    """A model folder's safetensors weights, read a share of rows at a time (a rank reads only its shards)."""

    def __init__(self, model_dir: str | Path) -> None:
        from safetensors import safe_open

        folder = Path(model_dir)
        index = folder / "model.safetensors.index.json"
        files = (sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file()
                 else ["model.safetensors"])
        if not all((folder / f).is_file() for f in files):
            raise FileNotFoundError(f"{folder} holds no safetensors weights (model.safetensors or its index)")
        self._stack = contextlib.ExitStack()
        self._where = {}
        for file in files:
            handle = self._stack.enter_context(safe_open(str(folder / file), framework="pt"))
            self._where.update(dict.fromkeys(handle.keys(), handle))

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def read(self, name: str, rows: slice) -> torch.Tensor:
        """Rows `rows` of the weight `name` (a 0-dimensional weight whole)."""
        part = self._where[name].get_slice(name)
        return part[rows] if part.get_shape() else part[:]

    def __enter__(self) -> CheckpointRows:
        return self

    def __exit__(self, *_: object) -> None:
        self._stack.close()


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole of a sharded tensor (a collective: every rank calls it); any other tensor as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def shard_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A full tensor cut down to this rank's share of `like` (a sharded parameter; every rank holds `value`, so
    nothing is sent); `value` itself when `like` is not sharded."""
    if not isinstance(like, DTensor):
        return value.to(like.device)
    return distribute_tensor(value.to(like.device_mesh.device_type), like.device_mesh, like.placements,
                             src_data_rank=None)


@contextlib.contextmanager
def gathered(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside: the model's parameters are whole on every rank (plain tensors, as if it were not sharded), e.g. to
    merge or save them; afterwards sharded again. A collective: every rank enters it. Writes to the whole
    parameters are not kept (load through `shard_like`)."""
    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for module in modules:
        module.unshard()
    try:
        yield model
    finally:
        for module in modules:
            module.reshard()


def full_optimizer_state(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer's `state_dict()` with every sharded tensor gathered whole (a collective)."""
    return {**state, "state": {index: {key: full(value) if isinstance(value, torch.Tensor) else value
                                       for key, value in entries.items()}
                               for index, entries in sorted(state["state"].items())}}


def sharded_optimizer_state(state: dict[str, Any], params: Sequence[torch.Tensor]) -> dict[str, Any]:
    """A full optimizer state dict cut down to this rank's shards of `params` (in the optimizer's order)."""
    def local(value: Any, param: torch.Tensor) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == param.shape:
            return shard_like(value, param)
        return value

    return {**state, "state": {index: {key: local(value, params[int(index)]) for key, value in entries.items()}
                               for index, entries in state["state"].items()}}


def _tied_parameters(model: torch.nn.Module) -> list[list[tuple[torch.nn.Module, str]]]:
    """Each parameter that several modules hold (tied embeddings): the (module, attribute name) of each holder."""
    holders: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            holders.setdefault(id(param), []).append((module, name))
    return [places for places in holders.values() if len(places) > 1]


def _unsplittable(model: torch.nn.Module) -> list[str]:
    """Class names of the blocks a transformers model says must stay whole (`_no_split_modules`: its decoder
    layers), found through peft's wrapper too; FSDP shards each such block as one unit."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return list(names)
    return []
