"""Dependency direction between packages (DESIGN.md section 3), and the pinned public surface."""

import ast
from pathlib import Path

import tracegym

SRC = Path(tracegym.__file__).parent
PACKAGES = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
ROOT = "tracegym"
"""Stands for the top-level `tracegym` module (its __init__), which imports core, envs and models."""

FORBIDDEN = {
    "core": {ROOT, "runtimes", "envs", "tasksets", "models", "serve", "eval", "train", "config", "cli", "testing"},
    "runtimes": {ROOT, "envs", "tasksets", "models", "serve", "eval", "train", "config", "cli", "testing"},
    "config": {ROOT, "envs", "tasksets", "models", "serve", "eval", "train", "cli", "testing"},
    "models": {ROOT, "envs", "tasksets", "serve", "eval", "train", "config", "cli", "testing"},
    "envs": {ROOT, "tasksets", "serve", "eval", "train", "config", "cli", "testing"},
    "tasksets": {ROOT, "models", "serve", "eval", "train", "config", "cli", "testing"},
    "testing": {ROOT, "tasksets", "serve", "eval", "train", "config", "cli"},
    "serve": {ROOT, "tasksets", "eval", "train", "cli", "testing"},
    "eval": {ROOT, "tasksets", "train", "cli", "testing"},
    "train": {ROOT, "tasksets", "eval", "cli", "testing"},
    "interop": {ROOT, "tasksets", "eval", "train", "cli", "testing"},
    "view": {ROOT, "tasksets", "serve", "interop", "cli", "testing"},
}
"""Packages each package must not import. `cli` sits on top and may import anything."""

IO_MODULES = {
    "asyncio", "aiohttp", "httpx", "requests", "urllib", "http", "socket", "ssl", "select", "selectors",
    "subprocess", "multiprocessing", "threading", "concurrent", "os", "shutil", "tempfile", "pathlib", "io",
    "sqlite3", "logging", "signal", "zmq", "torch", "transformers", "vllm",
}
"""Third-party and standard modules that do I/O (or start processes and threads): `core` imports none."""


def _imports(path: Path, source: str | None = None) -> set[str]:
    """Top-level modules a file imports: tracegym's packages by name (ROOT for `tracegym` itself), others
    by their first dotted part. Absolute, `from tracegym import X` and relative forms all count."""
    here = ["tracegym", *path.relative_to(SRC).parts[:-1]] if path.is_relative_to(SRC) else ["tracegym"]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.Import):
            found |= {_package(a.name.split(".")) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            parts = base + (node.module.split(".") if node.module else [])
            if parts == ["tracegym"]:
                found |= {a.name if a.name in PACKAGES else ROOT for a in node.names}
            else:
                found.add(_package(parts))
    return found


def _package(parts: list[str]) -> str:
    if parts[0] != "tracegym":
        return parts[0]
    return parts[1] if len(parts) > 1 else ROOT


def test_every_package_has_a_dependency_rule():
    assert PACKAGES - set(FORBIDDEN) == {"cli"}


def test_packages_import_only_downward():
    bad = []
    for package, forbidden in FORBIDDEN.items():
        for file in (SRC / package).rglob("*.py"):
            bad += [f"{file.relative_to(SRC)} -> {m}" for m in _imports(file) & forbidden]
    assert bad == []


def test_core_imports_nothing_that_does_io():
    bad = [f"{f.relative_to(SRC)} -> {m}" for f in (SRC / "core").rglob("*.py") for m in _imports(f) & IO_MODULES]
    assert bad == []


def test_only_serve_imports_zmq():
    users = {f.relative_to(SRC).parts[0] for f in SRC.rglob("*.py") if "zmq" in _imports(f)}
    assert users <= {"serve"}


def test_imports_sees_absolute_root_and_relative_forms():
    file = SRC / "core" / "trace.py"
    assert _imports(file, "import tracegym.envs.task") == {"envs"}
    assert _imports(file, "from tracegym.models import client") == {"models"}
    assert _imports(file, "from tracegym import evaluate, serve") == {ROOT, "serve"}
    assert _imports(file, "import tracegym") == {ROOT}
    assert _imports(file, "from . import graph\nfrom ..envs import task\nfrom .. import eval") == {
        "core", "envs", "eval"}
    assert _imports(file, "import zmq.asyncio\nfrom os import path") == {"zmq", "os"}


def _modules_imported(path: Path, root: Path = SRC) -> set[str]:
    """Dotted tracegym modules a file imports anywhere in it (a function's lazy import counts too)."""
    here = ["tracegym", *path.relative_to(root).with_suffix("").parts]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level] if node.level else []
            module = ".".join(base + (node.module.split(".") if node.module else []))
            found |= {module, *(f"{module}.{a.name}" for a in node.names)}
    return {m for m in found if m.startswith("tracegym.")}


def _circles(package: str, root: Path = SRC) -> list[list[str]]:
    """The import circles among one package's modules: each set of two or more files that reach each other."""
    files = {f"tracegym.{package}.{f.stem}": f for f in (root / package).glob("*.py") if f.stem != "__init__"}
    reach = {m: _modules_imported(f, root) & set(files) - {m} for m, f in files.items()}
    changed = True
    while changed:  # transitive closure by fixpoint: a package has a few dozen files
        changed = False
        for m in files:
            more = set().union(*(reach[n] for n in reach[m])) - reach[m]
            reach[m] |= more
            changed = changed or bool(more)
    return sorted({tuple(sorted({m, *(n for n in reach[m] if m in reach[n])})) for m in files if m in reach[m]})


def test_train_and_eval_have_no_import_circle():
    assert _circles("train") == []
    assert _circles("eval") == []


def test_circles_finds_a_loop_through_a_lazy_import(tmp_path: Path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("from tracegym.pkg.b import x\n")
    (package / "b.py").write_text("def f():\n    from tracegym.pkg import c\n")
    (package / "c.py").write_text("from . import a\n")
    (package / "d.py").write_text("from tracegym.pkg.a import y\n")
    assert _circles("pkg", tmp_path) == [("tracegym.pkg.a", "tracegym.pkg.b", "tracegym.pkg.c")]


PUBLIC_SURFACE = [
    "ContextLengthError", "Endpoint", "EnvironmentTask", "EnvironmentTaskset", "Episode", "ErrorKind", "FailureKind",
    "InfrastructureError", "InvalidMove", "Judge", "JudgeError", "Member", "Message", "ModelClient", "ModelError",
    "ModelRequest",
    "ModelResponse", "MultiAgentTask", "Outcome", "Sampling", "Seat", "Slot", "StopReason", "Task", "TaskData",
    "Taskset", "TasksetConfig", "Timeouts", "ToolCall", "Trace", "TracegymError", "UsageError", "evaluate",
    "evaluate_episodes", "known_tasksets", "load_taskset", "make_client", "metric", "reward", "run_episode",
    "run_group", "run_rollout", "stop",
]
"""Every name `tracegym` exports. Changing it is an API change: update this list on purpose."""


WHOLE_CONFIG_READERS = {"cli", "train/rl_config.py", "train/launch_plan.py", "train/roles.py"}
"""Where a function may take the whole `RLConfig`: the command, the config itself, and the builders at each process's
entry (the launch plan the command runs; each role's parts). Everything else takes its parts."""


def _takes_rl_config(path: Path) -> list[str]:
    nodes = ast.walk(ast.parse(path.read_text()))
    functions = [n for n in nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return [f.name for f in functions for a in [*f.args.args, *f.args.kwonlyargs]
            if a.annotation is not None and "RLConfig" in ast.unparse(a.annotation) and a.arg != "self"]


def test_only_the_entry_points_take_the_whole_rl_config():
    bad = [f"{f.relative_to(SRC)}: {name}" for f in SRC.rglob("*.py")
           if not ({f.relative_to(SRC).parts[0], str(f.relative_to(SRC))} & WHOLE_CONFIG_READERS)
           for name in _takes_rl_config(f)]
    assert bad == []


def test_public_surface_is_pinned():
    assert sorted(tracegym.__all__) == sorted(PUBLIC_SURFACE)
    assert len(tracegym.__all__) == len(set(tracegym.__all__))


def test_every_public_name_exists():
    assert [name for name in tracegym.__all__ if not hasattr(tracegym, name)] == []


def test_test_module_names_are_unique_across_folders():
    """Test folders have no __init__.py, so pytest refuses two test files with the same name."""
    names = [p.name for p in Path(__file__).parent.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
