"""Container image: the sandbox image of the `container` runtime, built on this host from Debian packages into the
engine's own store, never pulled from a registry.

The default image (`IMAGE`) is Debian bookworm's `minbase` variant plus `python3` (what the program init and most
agent programs need), made by `debootstrap` from the Debian mirror this host's apt already uses, trimmed (no apt
lists or package cache, no docs, man pages or locales) and loaded with `ENGINE import`. Building it takes root and
`debootstrap` (Debian: `apt-get install debootstrap`) and network to the mirror; each missing piece is named in the
error. `build_image` returns at once when the image is already in the store; two processes building at once take
turns (a file lock), so the second finds the first's.

    tracegym image [--engine podman] [--image NAME] [--mirror URL]

Measured on the machine this was written on (2 loaded cores, deb.debian.org): about 50 s to build, 121 MB in the
store; a second call returns in about 40 ms.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tracegym.runtimes.sandbox import RuntimeUnavailable

IMAGE = "tracegym-sandbox:bookworm"
"""The default image's name in the engine's store (podman shows it as `localhost/tracegym-sandbox:bookworm`)."""
SUITE = "bookworm"
PACKAGES = ("python3",)
"""Installed on top of debootstrap's `minbase` variant (which has only essential packages and apt)."""
DEFAULT_MIRROR = "http://deb.debian.org/debian"
"""The mirror used when this host's apt sources name none for `SUITE`."""
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
TRIMMED = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale",
           "usr/share/info")
"""What the image leaves out (emptied, so the folders stay): about half of what debootstrap installs."""
ENGINE_TIMEOUT_S = 600.0
"""How long one engine command of the build (the import) may take."""
LOCK = Path(tempfile.gettempdir()) / "tracegym-container-image.lock"
BUILD_HINT = "build it with `tracegym image` (as root; about a minute, from Debian packages)"


@dataclass(frozen=True)
class BuiltImage:
    """An image in the engine's store: its name, its size, and how long this call took to build it (0 when it was
    already there)."""

    engine: str
    image: str
    size_bytes: int
    build_s: float


def image_present(engine: str, image: str) -> bool:
    """True when `image` is in `engine`'s local store (asked of the store only: nothing is pulled)."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        done = subprocess.run([engine, "image", "inspect", image], capture_output=True, timeout=60)
        return done.returncode == 0
    return False


def image_size(engine: str, image: str) -> int:
    """The image's size in the store, in bytes (0 when the engine does not say)."""
    done = subprocess.run([engine, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True,
                          timeout=60, text=True)
    return int(done.stdout.split()[0]) if done.returncode == 0 and done.stdout.split() else 0


def build_image(engine: str, image: str = IMAGE, mirror: str | None = None) -> BuiltImage:
    """`image` in `engine`'s store, built from Debian packages when it is not there yet (see the module).
    RuntimeUnavailable naming what is missing when it cannot be built: root, debootstrap, the mirror."""
    start = time.monotonic()
    with _turn():
        if not image_present(engine, image):
            mirror = mirror or host_mirror()
            _check_can_build(mirror)
            with _build_folder() as root:
                _debootstrap(root, mirror)
                _trim(root)
                _import(engine, root, image)
            return BuiltImage(engine, image, image_size(engine, image), time.monotonic() - start)
    return BuiltImage(engine, image, image_size(engine, image), 0.0)


def host_mirror(sources: tuple[Path, ...] = APT_SOURCES) -> str:
    """The Debian mirror this host's apt uses for `SUITE` (the first source that lists it), else DEFAULT_MIRROR."""
    for path in sources:
        files = sorted(path.glob("*.list")) + sorted(path.glob("*.sources")) if path.is_dir() else [path]
        for file in files:
            with contextlib.suppress(OSError):
                if found := mirror_in(file.read_text(), deb822=file.suffix == ".sources"):
                    return found
    return DEFAULT_MIRROR


def mirror_in(text: str, *, deb822: bool) -> str | None:
    """The URI of the first entry of an apt sources file that lists `SUITE` itself (not `-updates`, `-security`),
    in one-line form (`deb [options] URI SUITE COMPONENTS`) or deb822 (`URIs:` and `Suites:` fields)."""
    lines = [line.split("#", 1)[0].strip() for line in text.splitlines() if not line.lstrip().startswith("#")]
    if not deb822:
        for line in lines:
            fields = re.sub(r"\[[^]]*\]", "", line).split()
            if len(fields) >= 3 and fields[0] == "deb" and fields[2] == SUITE:
                return fields[1].rstrip("/")
        return None
    for stanza in "\n".join(lines).split("\n\n"):
        entry = dict(line.split(":", 1) for line in stanza.splitlines() if ":" in line and not line[0].isspace())
        types, uris = entry.get("Types", "").split(), entry.get("URIs", "").split()
        if "deb" in types and SUITE in entry.get("Suites", "").split() and uris:
            return uris[0].rstrip("/")
    return None


def _check_can_build(mirror: str) -> None:
    """RuntimeUnavailable naming the first thing a build lacks here."""
    if os.geteuid() != 0:
        raise RuntimeUnavailable(f"building the container image needs root (debootstrap makes a Debian root "
                                 f"filesystem); {BUILD_HINT} as root, or name an image you have")
    if not shutil.which("debootstrap"):
        raise RuntimeUnavailable("building the container image needs debootstrap, which is not installed "
                                 "(Debian/Ubuntu: apt-get install debootstrap)")
    release = f"{mirror}/dists/{SUITE}/Release"
    try:
        with urllib.request.urlopen(urllib.request.Request(release, method="HEAD"), timeout=15):
            pass
    except (OSError, urllib.error.URLError) as exc:
        raise RuntimeUnavailable(f"building the container image needs network to the Debian mirror {mirror}, which "
                                 f"did not answer ({release}: {exc}); name a reachable one with --mirror") from None


@contextlib.contextmanager
def _turn() -> Iterator[None]:
    """Hold the build lock: one build at a time on this host."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextlib.contextmanager
def _build_folder() -> Iterator[Path]:
    """A fresh folder for the root filesystem, removed after (what debootstrap left mounted in it first)."""
    folder = Path(tempfile.mkdtemp(prefix="tracegym-image-", dir="/var/tmp"))
    try:
        yield folder / "root"
    finally:
        _unmount_under(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _debootstrap(root: Path, mirror: str) -> None:
    command = ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root), mirror]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        log = root / "debootstrap" / "debootstrap.log"
        said = (log.read_text(errors="replace") if log.exists() else done.stderr or done.stdout).strip()
        raise RuntimeUnavailable(f"debootstrap could not build the container image from {mirror} (exit status "
                                 f"{done.returncode}): {' | '.join(said.splitlines()[-5:])}")


def _trim(root: Path) -> None:
    for folder in TRIMMED:
        for entry in (root / folder).glob("*"):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _import(engine: str, root: Path, image: str) -> None:
    """Load the root filesystem into the engine's store as `image` (`tar | ENGINE import`)."""
    tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
    try:
        done = subprocess.run([engine, "import", "--change", "CMD [\"python3\"]", "-", image], stdin=tar.stdout,
                              capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar.wait()
    if done.returncode != 0 or tar.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeUnavailable(f"{engine} import of the container image failed (exit status {done.returncode}, "
                                 f"tar {tar.returncode}): {said[-1] if said else 'no reason given'}")


def _unmount_under(folder: Path) -> None:
    """Unmount (lazily, deepest first) whatever is mounted under `folder`: a failed debootstrap may leave its
    /proc and /sys there, which a removal must not walk into."""
    prefix = str(folder) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    libc = ctypes.CDLL(None, use_errno=True)
    for point in sorted(points, key=len, reverse=True):
        libc.umount2(point.encode(), 2)  # MNT_DETACH
