"""The serve package's boundaries: it alone imports zmq, and it sits below eval, train and cli."""

import ast
from pathlib import Path

import tracegym

SRC = Path(tracegym.__file__).parent


def _imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return found


def test_only_serve_imports_zmq():
    users = {f.relative_to(SRC).parts[0] for f in SRC.rglob("*.py")
             if any(m == "zmq" or m.startswith("zmq.") for m in _imported(f))}
    assert users == {"serve"}


def test_serve_does_not_import_eval_train_or_cli():
    bad = [f"{f.name} -> {m}" for f in (SRC / "serve").rglob("*.py") for m in _imported(f)
           if m.split(".")[:2] in (["tracegym", "eval"], ["tracegym", "train"], ["tracegym", "cli"])]
    assert bad == []
