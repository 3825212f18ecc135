"""Weight digest: a bitwise fingerprint of a model's trainable weights after a step, one hash per tensor.

The trainer records one per step (`digests/step-N.json` in the run folder, its whole digest in the step's trainer
record), so `tracegym rl --replay` can tell whether a step rerun from the run's own inputs gives the same weights
bit for bit, and which tensor first does not. A tensor is hashed as its float32 bytes on the CPU, whole (a sharded
one is gathered: every rank calls `weight_digest`).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from tracegym.train.data_parallel import full


@dataclass(frozen=True)
class WeightDigest:
    """The hashes of a model's trainable tensors, by parameter name in the model's order, and the torch threads
    the step ran with (float32 sums on a CPU depend on how the work was split)."""

    tensors: dict[str, str]
    threads: int

    @property
    def whole(self) -> str:
        """One hash over every tensor's (name, hash), in order."""
        return hashlib.blake2b("".join(f"{n}={h};" for n, h in self.tensors.items()).encode(),
                               digest_size=16).hexdigest()

    def first_difference(self, other: WeightDigest) -> str | None:
        """The name of the first tensor whose hash differs from `other`'s (or that only one of them has)."""
        for name in [*self.tensors, *(n for n in other.tensors if n not in self.tensors)]:
            if self.tensors.get(name) != other.tensors.get(name):
                return name
        return None

    def to_json(self) -> dict[str, object]:
        return {"whole": self.whole, "threads": self.threads, "tensors": self.tensors}

    @classmethod
    def from_json(cls, data: object) -> WeightDigest:
        """A digest as `to_json` wrote it; anything else is a ValueError."""
        tensors = data.get("tensors") if isinstance(data, dict) else None
        threads = data.get("threads") if isinstance(data, dict) else None
        if not isinstance(tensors, dict) or not isinstance(threads, int):
            raise ValueError("not a weight digest (needs `tensors` and `threads`)")
        return cls({str(k): str(v) for k, v in tensors.items()}, threads)


def weight_digest(model: torch.nn.Module) -> WeightDigest:
    """The digest of `model`'s trainable weights now (a collective when they are sharded), hashed on as many
    threads as torch uses (hashlib lets go of the GIL: a 135M model's 540 MB hash in about half the time on 2)."""
    named = [(name, full(p.detach())) for name, p in model.named_parameters() if p.requires_grad]
    threads = torch.get_num_threads()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        hashes = list(pool.map(tensor_hash, (tensor for _, tensor in named)))
    return WeightDigest({name: h for (name, _), h in zip(named, hashes, strict=True)}, threads)


def tensor_hash(tensor: torch.Tensor) -> str:
    """The hash of a tensor's float32 bytes (its shape included, so a reshape is a difference)."""
    data = tensor.to(device="cpu", dtype=torch.float32).contiguous()
    digest = hashlib.blake2b(str(tuple(data.shape)).encode(), digest_size=16)
    digest.update(data.numpy().data)
    return digest.hexdigest()
