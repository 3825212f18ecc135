"""Page: the HTML frame every viewer page shares (head, navigation, the layout's style: view/static/ styles the
fragments) and the small pieces pages are built from (numbers to 3 decimals, tables, key-value lists, notes,
fragments drawn by other modules)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from html import escape
from typing import Any

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#fafbfc}
header{background:#1d2330;color:#fff;padding:.5em 1em;display:flex;gap:1.5em;align-items:baseline}
header a{color:#cfe0ff}header .run{opacity:.8;font-size:.9em}
main{padding:1em;max-width:1400px}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #dde;padding:.2em .5em;text-align:left;
vertical-align:top}th{background:#eef1f6}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.problem td{background:#fff3f0}.err{color:#b00020}.muted{color:#667}.note{background:#fff8e0;
border:1px solid #eed78a;padding:.4em .7em;margin:.5em 0}
form.filters{display:flex;flex-wrap:wrap;gap:.6em;align-items:end;margin:.5em 0}
form.filters label{display:flex;flex-direction:column;font-size:.85em}
pre.raw{white-space:pre-wrap;word-break:break-word;margin:.4em .6em;font:13px/1.4 ui-monospace,monospace}
.env-response>.muted{font-size:12px}
dl.kv{display:grid;grid-template-columns:max-content auto;gap:.1em 1em}dl.kv dt{color:#445}dl.kv dd{margin:0}
.groups{display:flex;flex-wrap:wrap;gap:.5em 2.5em;align-items:flex-start}.groups h3{font-size:1em;margin:.3em 0}
section{margin:1.2em 0}h2{font-size:1.15em;margin:.3em 0}nav.pages a,nav.pages span{margin-right:.6em}
"""


def layout(title: str, body: str, *, run: str = "", refresh: int | None = None) -> str:
    """A whole page: `body` is already HTML. `refresh` reloads the page every that many seconds (a live run)."""
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">{meta}<title>{escape(title)} · tracegym'
            f'</title><style>{STYLE}</style><link rel="stylesheet" href="/static/viewer.css">'
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


def key_values(items: Iterable[tuple[str, Any]]) -> str:
    """A definition list of name: value (values printed by `number`)."""
    return '<dl class="kv">' + "".join(f"<dt>{escape(k)}</dt><dd>{number(v)}</dd>" for k, v in items) + "</dl>"


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
