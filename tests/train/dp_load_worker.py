"""One trainer process of the sharded-load tests: alone or as a rank under torchrun, for each action
`KIND:MODE:CHECKPOINT` it builds a trainer from a model folder (`build_trainer`: several ranks read only their
shards), then either takes one step and saves a checkpoint (`save`) or loads one (`load`); rank 0 writes every
parameter, gathered whole (`KIND-MODE-WORLD.safetensors`), and each rank how many values its shards hold.

    python dp_load_worker.py MODEL_DIR OUT lora:save:CKPT [full:load:CKPT2 ...]                          # alone
    python -m torch.distributed.run --nproc-per-node 2 dp_load_worker.py MODEL_DIR OUT lora:save:CKPT ...
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from safetensors.torch import save_file

from tracegym.core.sample import Sample
from tracegym.train.data_parallel import DataParallel, exit_process, full, join
from tracegym.train.trainer import TrainerConfig, build_trainer


def batch() -> list[Sample]:
    rng = random.Random(0)
    out = []
    for _ in range(6):
        mask = [False] * rng.randint(4, 12) + [True] * rng.randint(4, 12)
        out.append(Sample(token_ids=[rng.randrange(64) for _ in mask], loss_mask=mask,
                          logprobs=[-4.0 if m else 0.0 for m in mask], advantage=rng.uniform(-1, 1)))
    return out


def act(dp: DataParallel, model_dir: str, out: Path, kind: str, mode: str, checkpoint: Path) -> None:
    config = TrainerConfig(model=model_dir, lora=kind == "lora", num_threads=1, device="cpu",
                           compute_dtype="float32", learning_rate=1e-2)
    trainer = build_trainer(config, dp)
    if mode == "save":
        trainer.step(batch())
        trainer.save(checkpoint)
    else:
        trainer.load(checkpoint)
    whole = {name: full(param.detach()).clone() for name, param in trainer.model.named_parameters()}
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in trainer.model.parameters())
    tag = f"{kind}-{mode}-{dp.world}"
    if dp.main:
        save_file(whole, str(out / f"{tag}.safetensors"))
    (out / f"{tag}-rank{dp.rank}.json").write_text(json.dumps({"local": local, "version": trainer.version}))


def main(model_dir: str, out: Path, actions: list[str]) -> None:
    dp = join("cpu")
    for action in actions:
        kind, mode, checkpoint = action.split(":", 2)
        act(dp, model_dir, out, kind, mode, Path(checkpoint))
    dp.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
    exit_process(0)
