"""Error report: pydantic-config's multi-line validation report condensed to one line naming each flag."""

from __future__ import annotations


def one_line(report: str) -> str:
    """pydantic-config's multi-line report as `--flag: problem` items on one line."""
    lines = [ln.strip() for ln in report.splitlines() if ln.strip()]
    lines = [ln.removeprefix("Failed to validate config:").strip() for ln in lines]
    lines = [ln for ln in lines if ln and "validation error" not in ln]
    items: list[str] = []
    for line in lines:
        if line.startswith("--") and " " not in line:
            items.append(line)
        elif items and items[-1].startswith("--") and ":" not in items[-1]:
            items[-1] = f"{items[-1]}: {line}"
        else:
            items.append(line)
    return "; ".join(items) or report
