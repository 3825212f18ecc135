"""Summary view: a run's `summary.json` as written, laid out compactly: its top-level figures as one grid, each
table of tables (a debate's seats, per-reward stats) as one table with a row per entry, and tables of figures
sharing their keys (`pass_at_k`, `avg_at_k`, ... by k) side by side in one table.

Nothing is recomputed: every figure is the file's, printed by `page.number` (floats to 3 decimals), and each
figure's cell carries `data-key` = its dotted path in the file (`seats.judge.reward`).
"""

from __future__ import annotations

from html import escape
from typing import Any

from tracegym.view.page import key_values, number


def summary_html(summary: dict[str, Any]) -> str:
    """`summary` as a `<div class="summary">`: a grid of its scalar figures, then one table per group of its
    nested tables (see the module docstring)."""
    scalars = [(k, v) for k, v in summary.items() if not isinstance(v, dict)]
    nested = {k: v for k, v in summary.items() if isinstance(v, dict) and v}
    parts = [key_values(scalars, css="kv figures")] if scalars else []
    parts += [_table_of_tables(name, rows) for name, rows in nested.items() if _all_tables(rows)]
    flat = {k: dict(_flatten(v)) for k, v in nested.items() if not _all_tables(v)}
    for names in _same_keys(flat):
        parts.append(_side_by_side(names, flat))
    return f'<div class="summary">{"".join(parts)}</div>'


def _all_tables(values: dict[str, Any]) -> bool:
    return all(isinstance(v, dict) for v in values.values())


def _same_keys(tables: dict[str, dict[str, Any]]) -> list[list[str]]:
    """The names of `tables` grouped by their key sets, in the file's order."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, values in tables.items():
        groups.setdefault(tuple(values), []).append(name)
    return list(groups.values())


def _table_of_tables(name: str, rows: dict[str, dict[str, Any]]) -> str:
    """A row per entry (a seat, a reward), a column per figure its entries have (nested ones dotted)."""
    flat = {row: dict(_flatten(values)) for row, values in rows.items()}
    columns = list(dict.fromkeys(k for values in flat.values() for k in values))
    body = [[escape(row), *(_cell(f"{name}.{row}.{c}", values[c]) if c in values else "<td></td>" for c in columns)]
            for row, values in flat.items()]
    return _table(name, ["", *columns], body)


def _side_by_side(names: list[str], tables: dict[str, dict[str, Any]]) -> str:
    """Tables of figures with the same keys as one: a row per key, a column per table."""
    keys = list(tables[names[0]])
    body = [[escape(key), *(_cell(f"{name}.{key}", tables[name][key]) for name in names)] for key in keys]
    if len(names) == 1:  # its caption names it
        return _table(names[0], [], body)
    return _table("", ["", *names], body)


def _table(caption: str, head: list[str], body: list[list[str]]) -> str:
    # a dotted name may break after a dot, so a table of many figures fits the page
    heads = "".join(f"<th>{escape(h).replace('.', '.<wbr>')}</th>" for h in head)
    rows = "".join("<tr>" + "".join(f"<td>{c}</td>" if i == 0 else c for i, c in enumerate(row)) + "</tr>"
                   for row in body)
    return (f'<table class="summary-table">{f"<caption>{escape(caption)}</caption>" if caption else ""}'
            f'{f"<thead><tr>{heads}</tr></thead>" if head else ""}<tbody>{rows}</tbody></table>')


def _cell(key: str, value: Any) -> str:
    css = "num" if isinstance(value, int | float) or value is None else "text"
    return f'<td class="{css}" data-key="{escape(key)}">{number(value)}</td>'


def _flatten(values: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out
