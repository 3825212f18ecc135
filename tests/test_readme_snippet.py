"""The README's "Define a taskset" code runs exactly as printed (its endpoint pointed at a fake server)."""

import re
import subprocess
import sys
from pathlib import Path

from tracegym.cli.main import main
from tracegym.testing import FakeOpenAIServer

README = Path(__file__).parents[1] / "README.md"
PRINTED_URL = "http://127.0.0.1:8000/v1"


def define_a_taskset_code() -> str:
    section = README.read_text().split("## Define a taskset", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_the_define_a_taskset_snippet_runs_as_a_script_and_closes_its_client(tmp_path):
    code = define_a_taskset_code()
    assert PRINTED_URL in code
    with FakeOpenAIServer(rule=lambda request: request.messages[-1].text[::-1], model="SmolLM2-135M-Instruct") as fake:
        script = tmp_path / "reversals.py"
        script.write_text(code.replace(PRINTED_URL, fake.base_url))
        done = subprocess.run([sys.executable, "-W", "error::ResourceWarning", str(script)], capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Unclosed" not in done.stderr and "ResourceWarning" not in done.stderr, done.stderr
    assert [line.split()[-1] for line in done.stdout.splitlines()] == ["1.0"] * 8  # 2 tasks x 4 rollouts


def test_the_same_snippet_file_is_a_taskset_id_for_the_cli(tmp_path, capsys):
    script = tmp_path / "reversals.py"
    script.write_text(define_a_taskset_code())
    assert main(["eval", f"{script}:Reversals", "--dry-run"]) == 0
    assert "reversals.py:Reversals" in capsys.readouterr().out
