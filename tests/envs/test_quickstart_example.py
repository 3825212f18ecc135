"""examples/quickstart.py, the README's main job until the eval CLI: it runs and prints what it promises."""

import subprocess
import sys
from pathlib import Path

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.py"


def test_quickstart_runs_every_rollout_to_a_full_reward():
    done = subprocess.run([sys.executable, str(QUICKSTART)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:-1] == [f"{i}+{i}? -> {2 * i} reward 1.0 completed" for i in range(5) for _ in range(2)]
    assert lines[-1] == "10 traces, mean reward 1.00"
