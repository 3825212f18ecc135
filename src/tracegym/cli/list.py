"""`tracegym list`: every known taskset id with its one-line description."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tracegym.envs.registry import known_tasksets, load_taskset


def run(args: list[str]) -> int:
    """Print the table of tasksets (built-ins, then installed entry points)."""
    table = Table("taskset", "description", box=None, header_style="bold")
    for name in known_tasksets():
        try:
            description = load_taskset(name).description or "-"
        except Exception as exc:  # a broken plugin must not hide the others
            description = f"[red]cannot load: {exc}[/]"
        table.add_row(name, description)
    Console().print(table)
    return 0
