"""Page: the HTML frame every viewer page shares (head, navigation; `view/static/viewer.css` is the whole look)
and the small pieces pages are built from (numbers to 3 decimals, tables, key-value lists, notes,
fragments drawn by other modules)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from html import escape
from typing import Any


def layout(title: str, body: str, *, run: str = "", refresh: int | None = None) -> str:
    """A whole page: `body` is already HTML. `refresh` reloads the page every that many seconds (a live run)."""
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}<title>{escape(title)} · tracegym'
            f'</title><link rel="stylesheet" href="/static/viewer.css">'
            f'<script src="/static/viewer.js" defer></script></head><body><header><strong>tracegym view</strong>'
            f'<a href="/">run</a><span class="run">{escape(run)}</span></header><main>{body}</main></body></html>')


def number(value: Any) -> str:
    """A value as the pages print it: floats to 3 decimals, None as a dash."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3f}"
    return escape(str(value))


def table(head: Iterable[str], rows: Iterable[Iterable[str]], *, classes: Iterable[str] = ()) -> str:
    """A table; `head` is text, cells are already HTML; `classes` sets a class per row."""
    heads = "".join(f"<th>{h}</th>" for h in head)
    classes = list(classes)
    body = "".join(f'<tr class="{classes[i] if i < len(classes) else ""}">' + "".join(f"<td>{c}</td>" for c in row)
                   + "</tr>" for i, row in enumerate(rows))
    return f"<table><thead><tr>{heads}</tr></thead><tbody>{body}</tbody></table>"


def key_values(items: Iterable[tuple[str, Any]], *, css: str = "kv") -> str:
    """A definition list of name: value (values printed by `number`), of class `css`."""
    return f'<dl class="{css}">' + "".join(f"<dt>{escape(k)}</dt><dd>{number(v)}</dd>" for k, v in items) + "</dl>"


def section(title: str, body: str, *, id_: str = "") -> str:
    anchor = f' id="{escape(id_)}"' if id_ else ""
    return f"<section{anchor}><h2>{escape(title)}</h2>{body}</section>"


def note(text: str, *, error: bool = False) -> str:
    """A highlighted line of escaped text."""
    return f'<p class="note{" err" if error else ""}">{escape(text)}</p>'


def fragment(what: str, draw: Callable[..., str], *args: Any, **kwargs: Any) -> str:
    """A fragment drawn by another module (timeline, graph, tokens, ...); when drawing fails (a trace no check
    foresaw) the page says so in its place and shows the rest, and the error goes to the viewer's stderr."""
    try:
        return draw(*args, **kwargs)
    except Exception as exc:
        print(f"tracegym view: drawing the {what} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return note(f"the {what} could not be drawn: {type(exc).__name__}: {exc}", error=True)
