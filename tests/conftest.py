"""Session-wide test setup: bytecode caches written, and each session's own record of the vLLM servers it runs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from tracegym.models.embedded import cache_root

# The suite starts hundreds of Python processes (env-server workers, CLI runs, trainers): with
# PYTHONDONTWRITEBYTECODE set (some shells and agents set it), each would compile tracegym anew, and pytest would
# rewrite every test module's asserts on every run. Caches are written here, and by the processes tests start.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.fixture(scope="session", autouse=True)
def _own_server_records(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """`TRACEGYM_CACHE` is a folder of this session's (subprocesses inherit it), so no test reuses a vLLM that
    another `tracegym inference` on this machine serves (it records itself under `cache_root()/servers`), nor
    offers its own to other runs; the converted embedded model stays shared (`models` links to the real one)."""
    models = cache_root() / "models"
    models.mkdir(parents=True, exist_ok=True)
    private = tmp_path_factory.mktemp("tracegym-cache")
    (private / "models").symlink_to(models, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACEGYM_CACHE", str(private))
        yield
