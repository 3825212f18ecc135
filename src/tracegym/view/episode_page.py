"""Episode page: one multi-agent episode: its members side by side, each one's reward, outcome and trace, the
judge's verdict, the episode's metrics and the error that ended it."""

from __future__ import annotations

from html import escape

from tracegym.core.episode import Episode
from tracegym.view.page import fragment, key_values, note, number, section, table

try:  # view-detail's renderer; the page says so where it is missing
    from tracegym.view.episode_view import episode_html
except ImportError:  # pragma: no cover
    episode_html = None  # type: ignore[assignment]

JUDGES = ("judge",)
"""Member ids whose last reply is the episode's verdict."""


def episode_page(episode: Episode, *, where: str, number_: int, json_url: str) -> str:
    """The body of `/episode/<n>`: member traces link to `/episode/<n>/member/<id>`."""
    title = f"{episode.task_key} · episode {episode.episode_index}"
    stop = episode.stop_reason.value if episode.stop_reason else "none"
    parts = [f"<h1>{escape(title)}</h1>",
             f'<p class="muted">{escape(where)} · <a href="{escape(json_url)}">JSON</a></p>',
             section("Outcome", key_values([("taskset", episode.taskset), ("stop reason", stop),
                                            ("members", ", ".join(episode.members))]))]
    if episode.error is not None:
        e = episode.error
        parts.append(note(f"{e.kind.value} error in {e.stage}: {e.message}", error=True))
    parts.append(section("Members", _members(episode, number_)))
    verdict = _verdict(episode)
    if verdict:
        parts.append(section("Verdict", verdict))
    if episode.metrics:
        parts.append(section("Episode metrics", key_values(sorted(episode.metrics.items()))))
    parts.append(section("Side by side", fragment("episode view", episode_html, episode, episode.traces)))
    return "".join(parts)


def _members(episode: Episode, number_: int) -> str:
    rows = []
    for member in episode.members:
        trace = episode.traces.get(member)
        outcome = episode.outcomes.get(member)
        metrics = ", ".join(f"{escape(k)} {number(v)}" for k, v in episode.member_metrics.get(member, {}).items())
        link = (f'<a href="/episode/{number_}/member/{escape(member)}">trace</a>' if trace is not None
                else '<span class="muted">no trace</span>')
        rows.append([escape(member), escape(episode.models.get(member, "")),
                     "yes" if episode.trainable.get(member) else "no", number(episode.rewards.get(member)),
                     escape(outcome.value if outcome else ""), metrics,
                     number(trace.num_turns if trace else None), link])
    return table(["member", "model", "trains", "reward", "outcome", "metrics", "turns", ""], rows)


def _verdict(episode: Episode) -> str:
    """The judge's last reply, as said (the verdict error, if it did not parse, is on the episode)."""
    judges = [m for m in episode.members if m in JUDGES and m in episode.traces]
    return "".join(f"<p><strong>{escape(m)}</strong></p><pre class=raw>{escape(episode.traces[m].last_reply)}</pre>"
                   for m in judges)
