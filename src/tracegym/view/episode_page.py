"""Episode page: one multi-agent episode (its members side by side, per-member rewards, the judge's verdict, the
error that ended it: view-detail's episode view) with a link to each member's own trace page."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from tracegym.core.episode import Episode
from tracegym.view.episode_view import episode_html
from tracegym.view.page import fragment


def episode_page(episode: Episode, *, where: str, number_: int, json_url: str) -> str:
    """The body of `/episode/<n>`: member traces link to `/episode/<n>/member/<id>`."""
    title = f"task {episode.task_key} · episode {episode.episode_index}"
    links = " ".join(_member_link(number_, m) if m in episode.traces
                     else f'<span class="muted">{escape(m)} (no trace)</span>' for m in episode.members)
    return (f"<h1>{escape(title)}</h1><p class=\"muted\">{escape(where)} · <a href=\"{escape(json_url)}\">JSON</a>"
            f"</p><p>each member's trace: {links}</p>"
            + fragment("episode view", episode_html, episode, episode.traces, lambda m: member_url(number_, m)))


def member_url(number_: int, member: str) -> str:
    """The URL of member `member`'s trace page of episode row `number_`."""
    return f'/episode/{number_}/member/{quote(member, safe="")}'


def _member_link(number_: int, member: str) -> str:
    return f'<a href="{escape(member_url(number_, member))}">{escape(member)}</a>'
