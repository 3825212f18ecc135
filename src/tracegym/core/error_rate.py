"""Error rate: `--max-error-rate`'s one rule, shared by `tracegym eval` and `tracegym rl`."""

from __future__ import annotations


def failed_share(bad: int, total: int, unit: str, max_error_rate: float) -> str | None:
    """"`bad` of `total` `unit` failed (...), more than --max-error-rate allows" when more than that fraction
    failed; None when not (or when nothing ran)."""
    if total == 0 or bad / total <= max_error_rate:
        return None
    return f"{bad} of {total} {unit} failed ({bad / total:.0%}), more than --max-error-rate {max_error_rate:g} allows"
