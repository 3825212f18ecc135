"""A taskset that says it runs at most 3 rollouts at once (as an OpenEnv server's sessions do): `SPEC`."""

from __future__ import annotations

from pathlib import Path

from tracegym import Taskset

SPEC = f"{Path(__file__)}:Narrow"


class Narrow(Taskset):
    id = "narrow"

    def __init__(self, config=None, **options) -> None:
        super().__init__(config, data=[{"prompt": "Say a."}], **options)

    def capacity(self) -> int | None:
        return 3
