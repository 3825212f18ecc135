"""Benchmark: `tracegym view` on a run folder of 100,000 single-turn traces (issue 19's targets: run page first
response and a filter query under 1 s each, the viewer process under 300 MB).

Writes an eval run folder of `--traces` single-turn traces (outside the clock: 1,000 tasks, rewards 0 / 1 /
unscored, some model errors and truncations), starts `tracegym view` on it as a user does (a subprocess, port 0),
and times over HTTP: the first response of the run page (the index is still being built), the time until every
line is indexed, the run page again, a filter query (stop reason + reward range + sort), a search in message text
(cold, then paged), and trace pages (the first waits for the model's tokenizer, which the viewer loads once it has
indexed the folder); then reads the viewer's peak RSS (VmHWM). The machine's load average is printed: on the
shared 2-core machine every figure scales with it. Side by side, in its own process: what reading the whole run
as episodes costs (`RunFolder.log.read()`, as `tracegym show` does), the approach the index avoids.

    flock /tmp/tracegym-heavy.lock .venv/bin/python benchmarks/view_run_folder.py [--traces 100000]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from tracegym.core.errors import ErrorKind
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason, Usage
from tracegym.eval.run_folder import RunFolder
from tracegym.eval.summary import summarize
from tracegym.testing import make_trace

TARGET_S = 1.0
TARGET_MB = 300.0
FILTER = "/?stop=completed&reward_min=1&sort=tokens&desc=1"
SEARCH = "/?q=word4242"


def write_run(root: Path, n: int, seed: int = 0) -> Path:
    """An eval run folder of `n` single-turn traces and the summary of a sample of them."""
    rng = random.Random(seed)
    tasks = [TaskData(prompt=f"Reverse the text: word{i} and some more words to make it a realistic prompt")
             for i in range(1000)]
    folder = RunFolder.create(root, "reverse-text", "SmolLM2-135M-Instruct", run_id="bench")
    folder.write_config({"taskset": "reverse-text", "model": {"name": "SmolLM2-135M-Instruct"}, "rollouts": n // 1000})
    sample = []
    with folder.traces_path.open("w") as out:
        for i in range(n):
            task = tasks[i % len(tasks)]
            error = ErrorKind.MODEL if rng.random() < 0.02 else None
            stop = StopReason.TRUNCATED if rng.random() < 0.05 else StopReason.COMPLETED
            trace = make_trace(task.prompt, f"sdrow erom emos dna {i % 1000}drow", task=task,
                               reward=rng.choice((0.0, 1.0, 1.0, None)), rollout_index=i // len(tasks), error=error,
                               stop_reason=stop, taskset="reverse-text",
                               usage=Usage(prompt_tokens=40, completion_tokens=rng.randint(5, 60)))
            out.write(trace.model_dump_json() + "\n")
            if i < 1000:
                sample.append(trace)
    folder.write_summary(summarize(sample).model_dump(mode="json"))
    return folder.path


def get(url: str) -> tuple[float, int, str]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        body = response.read().decode()
        return time.perf_counter() - start, response.status, body


def peak_mb(pid: int) -> float:
    found = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(found.group(1)) / 1024 if found else float("nan")


def measure_viewer(run: Path, total: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    viewer = subprocess.Popen([sys.executable, "-m", "tracegym.cli.main", "view", str(run), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = viewer.stdout.readline() if viewer.stdout else ""
        found = re.search(r"(http://\S+)/", line)
        if not found:
            raise RuntimeError(f"tracegym view printed {line!r}")
        base = found.group(1)
        out = {"start to URL printed (s)": time.perf_counter() - started}
        first, status, body = get(base + "/")
        assert status == 200 and "Summary" in body
        out["run page, first response (s)"] = first
        while '"pending_bytes": 0' not in get(base + "/api/run")[2] or \
                f'"traces": {total},' not in get(base + "/api/run")[2]:
            time.sleep(0.05)
        out["start to fully indexed (s)"] = time.perf_counter() - started
        out["trace page, first (s)"] = get(base + "/trace/0")[0]  # waits for the tokenizer the viewer loads
        out["run page, indexed (s)"] = statistics.median(get(base + "/")[0] for _ in range(5))
        times = [get(base + FILTER) for _ in range(5)]
        assert "matching" in times[0][2]
        out["filter query, first (s)"] = times[0][0]
        out["filter query, median of 5 (s)"] = statistics.median(t[0] for t in times)
        out["search, cold (s)"] = get(base + SEARCH)[0]
        out["search, next page (s)"] = get(base + SEARCH + "&page=2")[0]
        out["trace page, next (s)"] = get(base + f"/trace/{total - 1}")[0]
        out["viewer peak RSS (MB)"] = peak_mb(viewer.pid)
        return out
    finally:
        viewer.terminate()
        viewer.wait(10)


def measure_whole_load(run: Path) -> dict[str, float]:
    """Reading every trace into memory, as `tracegym show` does: time and peak RSS, in a fresh process."""
    code = ("import re,sys,time;from pathlib import Path;from tracegym.eval.run_folder import RunFolder;"
            "t=time.perf_counter();f=RunFolder(Path(sys.argv[1])).log.read();d=time.perf_counter()-t;"
            "m=re.search(r'VmHWM:\\s+(\\d+) kB',Path('/proc/self/status').read_text());"
            "print(len(f.traces),d,int(m.group(1))/1024)")
    done = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True,
                          check=True)
    _, seconds, mb = done.stdout.split()
    return {"load whole file (s)": float(seconds), "load whole file peak RSS (MB)": float(mb)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        run = write_run(Path(tmp), args.traces)
        size = (run / "traces.jsonl").stat().st_size
        print(f"wrote {args.traces:,} traces ({size / 2**20:.0f} MiB) in {time.perf_counter() - start:.1f} s")
        load = f"{os.getloadavg()[0]:.1f}"
        viewer = measure_viewer(run, args.traces)
        whole = measure_whole_load(run)
    print(f"load average before: {load} / after: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
    print(f"\n{'measure':38} {'value':>9} {'target':>8} {'ratio':>6}")
    for name, value in viewer.items():
        target = TARGET_MB if "MB" in name else TARGET_S if name.startswith(("run page", "filter")) else None
        ratio = f"{value / target:6.2f}" if target else ""
        print(f"{name:38} {value:9.3f} {target or '':>8} {ratio}")
    for name, value in whole.items():
        print(f"{name:38} {value:9.3f}")
    memory = viewer["viewer peak RSS (MB)"] / whole["load whole file peak RSS (MB)"]
    print(f"\nviewer peak RSS / whole-file load peak RSS: {memory:.2f}")


if __name__ == "__main__":
    main()
