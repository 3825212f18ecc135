"""Old code: start a benchmark's servers from another checkout's `src`, to print old and new side by side in one run.

    with code_from("/tmp/old/src"), local_server(...) as address: ...   # that server runs the old code
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def code_from(src: str | None) -> Iterator[None]:
    """Child processes started inside run the code under `src` (None: this checkout's, as the parent does)."""
    before = os.environ.get("PYTHONPATH")
    if src is not None:
        os.environ["PYTHONPATH"] = src
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
