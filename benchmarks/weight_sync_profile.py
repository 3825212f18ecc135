"""Benchmark: where the LoRA merge sync's seconds go in vLLM, from py-spy's samples of the server during publishes.

SmolLM2-135M with LoRA r=16 on every linear layer, vLLM (CPU build, one process, the merge extension), the
benchmark's `adapter-merge` way (`weight_sync.py`): the trainer writes its adapter, vLLM merges it in place. After
two warm-up publishes, py-spy (`--subprocesses`, `--rate`) samples the server while `--reps` publishes run; each
sample is put in the first bucket whose frame it holds (`BUCKETS`, in order), and the table gives each bucket's
seconds per publish next to the publish's wall time measured by the trainer.

    flock /work/heavy.lock .venv/bin/python benchmarks/weight_sync_profile.py [--reps 20] [--rate 250] [--keep raw.txt]
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tracegym.models.embedded import SERVED_MODEL_NAME, embedded_model_dir
from tracegym.models.vllm_server import VLLMServer, VLLMServerConfig
from tracegym.train.trainer import TrainerConfig, build_trainer
from tracegym.train.weight_sync import MergedWeightSync

BUCKETS = (
    ("vLLM: repack each layer for oneDNN (process_weights_after_loading)",
     ("create_onednn_mm", "dispatch_cpu_unquantized_gemm", "process_weights_after_loading")),
    ("vLLM: allocate each layer's tensors (materialize_layer)", ("materialize_layer",)),
    ("vLLM: copy back into the kept tensors (_copy_and_restore_kernel_tensors)",
     ("_copy_and_restore_kernel_tensors", "_place_kernel_tensors")),
    ("ours: W + s*B@A in float32, cast to bfloat16 (merge_into)", ("merge_into", "merged (")),
    ("ours: read the adapter file (read_adapter)", ("read_adapter",)),
    ("ours: check vLLM serves the base (_check_served)", ("_check_served",)),
    ("vLLM: set up the reload (initialize_layerwise_reload)", ("initialize_layerwise_reload",)),
    ("vLLM: finish the reload (finalize_layerwise_reload)", ("finalize_layerwise_reload",)),
    ("vLLM: weight loaders (copy each weight into its stacked slot)", ("weight_loader", "load_weights")),
    ("vLLM: rest of reload_weights", ("reload_weights",)),
    ("ours: rest of merge_adapter (stacking, the layers' bookkeeping)", ("merge_adapter",)),
    ("outside the merge: HTTP, RPC to the worker, engine loop, prefix-cache reset", ("",)),
)
"""(bucket, frame substrings): a sample goes to the first bucket one of whose substrings is in one of its frames."""


def bucket_of(stack: str) -> str:
    return next(name for name, marks in BUCKETS if any(mark in stack for mark in marks))


def buckets(raw: Path) -> collections.Counter[str]:
    """Samples per bucket in py-spy's raw output (`frame;frame;... count` lines)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            counts[bucket_of(stack)] += int(count)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=20, help="publishes sampled")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--keep", type=Path, help="also copy py-spy's raw samples (collapsed stacks) here")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    model_dir = str(embedded_model_dir())
    trainer = build_trainer(TrainerConfig(model=model_dir, lora=True, lora_rank=16, lora_alpha=32, num_threads=2))
    with torch.no_grad():
        for name, param in trainer.model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.02)
    config = VLLMServerConfig(model=model_dir, served_model_name=SERVED_MODEL_NAME, max_model_len=512,
                              cpu_kv_cache_gib=0.25, cpu_one_process=True, merge_adapters=True)
    with tempfile.TemporaryDirectory(prefix="tracegym-sync-prof-") as tmp, VLLMServer(config) as server:
        sync = MergedWeightSync(server.base_url, SERVED_MODEL_NAME, base_model=model_dir)
        adapter = trainer.save_weights(Path(tmp) / "adapter")
        for version in (1, 2):
            sync.publish(adapter, version)
        raw = Path(tmp) / "py-spy.txt"
        spy = subprocess.Popen([py_spy, "record", "--pid", str(server.pid), "--subprocesses", "--rate",
                                str(args.rate), "--format", "raw", "--nonblocking", "-o", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # py-spy attaches before the first sampled publish
        seconds = []
        for version in range(3, 3 + args.reps):
            sync.publish(adapter, version)
            seconds.append(sync.last_seconds)
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
        counts = buckets(raw)
        if args.keep:
            shutil.copyfile(raw, args.keep)
    per = 1.0 / args.rate / args.reps
    print(f"merge sync profile: {args.reps} publishes, py-spy at {args.rate}/s; publish wall (trainer's view): "
          f"mean {statistics.fmean(seconds):.3f} s, median {statistics.median(seconds):.3f} s")
    print(f"{'where':<80}{'s/publish':>10}")
    for name, _ in BUCKETS:
        print(f"{name:<80}{counts[name] * per:>10.3f}")
    print(f"{'sampled in all (busy threads of the server; idle waits are not sampled)':<80}"
          f"{sum(counts.values()) * per:>10.3f}")


if __name__ == "__main__":
    main()
