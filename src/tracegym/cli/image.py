"""`tracegym image`: build the `container` runtime's sandbox image from Debian packages into the engine's store
(once: a second call returns at once; never pulled from a registry; see `tracegym.runtimes.container_image`).

    tracegym image [--engine podman|docker] [--image NAME] [--mirror URL]

Prints the image, its size and how long the build took. Needs root, debootstrap and network to the Debian mirror
(default: the one this host's apt uses); says which is missing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tracegym.runtimes.container import ENGINES, detect_engine
from tracegym.runtimes.container_image import IMAGE, build_image
from tracegym.runtimes.sandbox import RuntimeUnavailable


def run(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tracegym image", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=ENGINES, help="the engine whose store gets it (default: the detected one)")
    parser.add_argument("--image", default=IMAGE, help=f"its name (default {IMAGE})")
    parser.add_argument("--mirror", help="the Debian mirror (default: the one this host's apt uses)")
    options = parser.parse_args(args)
    engine, why = (options.engine, "") if options.engine else detect_engine()
    if engine is None:
        raise RuntimeUnavailable(f"no container engine answers here: {why}")
    built = build_image(engine, options.image, options.mirror)
    how = f"built in {built.build_s:.1f} s" if built.build_s else "already there"
    print(f"{built.image} in {Path(built.engine).name}'s store: {built.size_bytes / 1e6:.0f} MB, {how}")
    return 0
