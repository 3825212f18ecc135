"""Dependency direction between packages, and the pinned public surface."""

import ast
from pathlib import Path

import tracegym

SRC = Path(tracegym.__file__).parent
FORBIDDEN = {
    "core": {"envs", "tasksets", "models", "serve", "eval", "train", "cli", "testing"},
    "models": {"envs", "tasksets", "serve", "eval", "train", "cli", "testing"},
    "envs": {"tasksets", "serve", "eval", "train", "cli", "testing"},
    "eval": {"train"},
    "train": {"eval"},
}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tracegym."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("tracegym.")}
    return found


def test_packages_import_only_downward():
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for file in (SRC / package).rglob("*.py"):
            bad += [f"{file.name} -> {m}" for m in _imports(file) & forbidden]
    assert bad == []


def test_public_surface_is_pinned():
    assert "evaluate" in tracegym.__all__ and "Trace" in tracegym.__all__
    assert all(hasattr(tracegym, name) for name in tracegym.__all__)


def test_test_module_names_are_unique_across_folders():
    """Test folders have no __init__.py, so pytest refuses two test files with the same name."""
    names = [p.name for p in Path(__file__).parent.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
