"""`tracegym list`: every known taskset id with its seats (a multi-agent one's members) and one-line description."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tracegym.envs.evaluate import seats_of
from tracegym.envs.registry import known_tasksets, load_taskset

SINGLE_AGENT = "-"
"""The seats column of a single-agent taskset."""


def run(args: list[str]) -> int:
    """Print the table of tasksets (built-ins, then installed entry points)."""
    table = Table("taskset", "seats", "description", box=None, header_style="bold")
    for row in taskset_rows():
        table.add_row(*row)
    Console().print(table)
    return 0


def taskset_rows(names: list[str] | None = None) -> list[tuple[str, str, str]]:
    """(id, seats, description) of every known taskset (or of `names`): a multi-agent one's member ids, `-` for a
    single-agent one; a taskset that cannot load says why (a broken plugin must not hide the others)."""
    rows = []
    for name in known_tasksets() if names is None else names:
        try:
            taskset = load_taskset(name)
        except Exception as exc:  # a plugin's own code: whatever it raises is its row's message
            rows.append((name, "?", f"[red]cannot load: {exc}[/]"))
            continue
        seats = ", ".join(m.id for m in seats_of(taskset)) or SINGLE_AGENT
        rows.append((name, seats, taskset.description or "-"))
    return rows
