"""The README's OpenEnv client snippet runs as printed against `tracegym serve ... --protocol openenv`."""

import contextlib
import io
import re
from pathlib import Path

from tracegym import load_taskset
from tracegym.interop.openenv_server import OpenEnvServer

README = Path(__file__).parents[2] / "README.md"
PRINTED_URL = "ws://127.0.0.1:8001"


def test_the_openenv_client_snippet_plays_a_served_taskset():
    section = README.read_text().split("## OpenEnv and TRL", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert PRINTED_URL in code
    with OpenEnvServer(load_taskset("reverse-text")).running() as url:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code.replace(PRINTED_URL, url), {})
    prompt, scores = out.getvalue().strip().splitlines()[-2:]
    assert prompt == load_taskset("reverse-text")[0].prompt
    assert scores.startswith("True ") and "'lcs':" in scores
