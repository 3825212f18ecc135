"""The disk keeper (`runtimes.workdir`): not root, one tmpfs of disk_mb held in a keeper's own user and mount
namespaces caps a sandbox's folder; the host reaches it through the keeper's root, a program started in the
keeper's namespaces sees it at the folder's own path, and the removal ends the keeper and its tmpfs."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracegym.runtimes import workdir as workdirs
from tracegym.runtimes.processes import process_alive
from tracegym.runtimes.workdir import enter_disk, make_workdir, read_file, remove_workdir, write_file

DISK_MB = 4


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The working directory of a sandbox folder made as if not root (the keeper needs no root: `unshare --user`)."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    workdir, capped = make_workdir(f"{os.getpid()}-keeper-test", None, DISK_MB, namespaced=True)
    try:
        assert capped, "no keeper: unprivileged user namespaces missing here?"
        yield workdir
    finally:
        remove_workdir(workdir.parent)


def test_the_host_reaches_the_keepers_tmpfs_through_the_working_directorys_path(kept: Path) -> None:
    keeper = workdirs._KEEPERS[kept.parent]
    assert kept.is_symlink() and Path(os.readlink(kept)) == keeper.root / kept.relative_to("/")
    write_file(kept, "sub/data.txt", "from the host")
    assert read_file(kept, "sub/data.txt") == b"from the host"
    assert (kept / "sub" / "data.txt").read_text() == "from the host"


def test_a_program_in_the_keepers_namespaces_sees_the_same_files_at_the_same_path(kept: Path) -> None:
    write_file(kept, "data.txt", "shared")
    done = subprocess.run([*enter_disk(kept.parent), "sh", "-c", f"cat {kept}/data.txt; echo; stat -f -c %T {kept}"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["shared", "tmpfs"]


def test_the_working_directory_and_scratch_folders_share_one_cap(kept: Path) -> None:
    written = 0
    with contextlib.suppress(OSError):
        for i in range(4 * DISK_MB):
            for folder in ("work", "tmp", "shm", "home"):
                (kept.parent / folder / f"fill-{i}").write_bytes(b"x" * (256 << 10))
                written += 256 << 10
    assert written <= DISK_MB << 20


def test_removal_ends_the_keeper_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    workdir, _ = make_workdir(f"{os.getpid()}-keeper-test", None, DISK_MB, namespaced=True)
    pid = workdirs._KEEPERS[workdir.parent].proc.pid
    remove_workdir(workdir.parent)
    assert not process_alive(pid) and not workdir.parent.exists() and workdir.parent not in workdirs._KEEPERS
