"""Text reader: one text of one message (its content's text, its reasoning or a tool call's arguments, as
`message_view.text_parts` names them) in pages of `TEXT_CAP` characters, for a message too long for a page to
inline; each page is one escaped `<pre>`, and the pages joined are the whole text."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import Any

from tracegym.core.graph import Node
from tracegym.core.trace import Trace
from tracegym.view.message_view import TEXT_CAP, page_count, text_parts, text_url
from tracegym.view.row_query import QueryError
from tracegym.view.run_folder_index import RowError


@dataclass(frozen=True)
class TextPage:
    """Page `page` (from 1) of the `pages` of text `part` of a trace's node `node`."""

    node: Node
    part: str
    parts: list[str]
    """The names of all the node's texts."""
    page: int
    pages: int
    chars: int
    """The whole text's length in characters."""
    start: int
    """Where this page starts in the whole text (characters from 0)."""
    text: str

    def json(self) -> dict[str, Any]:
        """The page as `/api/.../node/ID/text` gives it."""
        return {"node": self.node.id, "role": self.node.message.role, "part": self.part, "parts": self.parts,
                "page": self.page, "pages": self.pages, "page_chars": TEXT_CAP, "chars": self.chars,
                "start": self.start, "text": self.text}


def text_page(trace: Trace, node: str, part: str, page: str) -> TextPage:
    """The page asked for by the URL's node id, `part` and `page` (text, as given): a RowError (404) naming what
    the trace has when the node, the part or the page is not there; a QueryError when `page` is no number."""
    nodes = trace.graph.nodes
    if not node.isdigit() or len(node) > 12 or int(node) >= len(nodes):
        raise RowError(f"this trace has no node {node[:40]!r}: its nodes are 0 to {len(nodes) - 1}", 404)
    found = nodes[int(node)]
    parts = text_parts(found.message)
    if part not in parts:
        raise RowError(f"node {found.id} has no text {part[:40]!r}: it has {', '.join(parts)}", 404)
    text = parts[part]
    pages = page_count(len(text))
    if not page.isdigit() or len(page) > 12:
        raise QueryError(f"page={page[:40]!r} is not a page number (a whole number from 1)")
    if not 1 <= int(page) <= pages:
        raise RowError(f"page {page} is out of range: the {part} of node {found.id} has pages 1 to {pages}", 404)
    start = (int(page) - 1) * TEXT_CAP
    return TextPage(found, part, list(parts), int(page), pages, len(text), start, text[start : start + TEXT_CAP])


def text_page_html(shown: TextPage, *, reader: str, where: str, json_url: str) -> str:
    """The body of a reader page: which text it is, where it came from (`reader`: the trace page's URL), the
    page's characters in a `<pre class="reader">` between two page navigations."""
    node = shown.node
    title = f"node {node.id} · {node.message.role} · {_part_name(shown.part)}"
    end = shown.start + len(shown.text)
    span = f"characters {shown.start + 1:,} to {end:,} of {shown.chars:,}" if shown.text else "an empty text"
    others = [f'<a href="{escape(text_url(reader, node.id, p))}">{escape(_part_name(p))}</a>'
              for p in shown.parts if p != shown.part]
    nav = _nav(shown, reader)
    return (f"<h1>{escape(title)}</h1>"
            f'<p class="muted">{escape(where)} · <a href="{escape(reader)}#conversation">← the trace</a> · '
            f'<a href="{escape(json_url)}">JSON</a></p>'
            + (f'<p>the node\'s other texts: {" · ".join(others)}</p>' if others else "")
            + f'<p class="reader-span">{span}</p>{nav}'
            f'<pre class="raw reader" data-page="{shown.page}" data-start="{shown.start}">{escape(shown.text)}</pre>'
            f"{nav}")


def _nav(shown: TextPage, reader: str) -> str:
    """First, previous, "page K of M", a box to go to a page (a plain GET form), next, last."""
    def link(page: int, label: str) -> str:
        if page == shown.page or not 1 <= page <= shown.pages:
            return f'<span class="muted">{label}</span>'
        return f'<a href="{escape(text_url(reader, shown.node.id, shown.part, page))}">{label}</a>'

    part = f'<input type="hidden" name="part" value="{escape(shown.part)}"/>' if shown.part != "text" else ""
    jump = (f'<form class="goto" method="get">{part}go to page <input name="page" type="number" min="1" '
            f'max="{shown.pages}" value="{shown.page}"/></form>')
    return (f'<nav class="pages reader-pages">{link(1, "« first")} {link(shown.page - 1, "← previous")} '
            f'<span class="page-of">page {shown.page} of {shown.pages}</span> {jump} '
            f'{link(shown.page + 1, "next →")} {link(shown.pages, "last »")}</nav>')


def _part_name(part: str) -> str:
    if part.startswith("call-"):
        return f"arguments of tool call {part.removeprefix('call-')}"
    return part
