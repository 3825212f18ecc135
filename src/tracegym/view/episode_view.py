"""Episode view: a multi-agent episode as HTML: its members side by side, each column that member's own view
(its trace's conversation: its turns as assistant, the others' public output as attributed user messages),
with per-member rewards and outcomes, the judge's verdict, private reasoning marked private and parse errors
flagged.

A column shows only its member's own trace, which holds only what that member saw (`envs.view`): another
member's `<think>` reasoning never reaches it, so it can never show there; in its own column it is marked.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from tracegym.core.episode import Episode
from tracegym.core.errors import TraceError
from tracegym.core.trace import Trace
from tracegym.envs.view import public_text
from tracegym.view.message_view import PREVIEW_CAP, message_html
from tracegym.view.page import number

VERDICT_WORD = "verdict:"
"""A judge's reply ends with a line `VERDICT: X` (`envs.multi_agent.verdict`); the line is shown as it was."""


def episode_html(episode: Episode, traces: dict[str, Trace], reader: Callable[[str], str] | None = None) -> str:
    """`episode` as a `<section class="episode">`: a head (taskset, task, episode index, stop reason, the error
    that ended it), the verdict (the last `VERDICT:` line of any member's last public reply) as
    `<div class="verdict">`, a table of members (model, trains, reward, outcome, metrics), and one
    `<div class="member" data-member=ID>` column per member in seat order, from `traces[ID]` (else
    `episode.traces[ID]`; a member with neither shows that no trace was recorded). In a column, messages
    another member said carry `data-from=THAT_MEMBER`; nodes whose markup did not parse carry
    `data-parse-error`. A message too long to inline (`message_view.TEXT_CAP`) links to the text reader under
    `reader(member)`, that member's trace page URL, when given."""
    found = {m: traces.get(m) or episode.traces.get(m) for m in episode.members}
    parts = [_head(episode), _verdict(found), _members_table(episode, found)]
    columns = "".join(_column(episode, m, found[m], reader(m) if reader else None) for m in episode.members)
    parts.append(f'<div class="members" style="--members: {len(episode.members)}">{columns}</div>')
    return f'<section class="episode" data-episode="{escape(episode.id)}">{"".join(parts)}</section>'


def _head(episode: Episode) -> str:
    facts = [("taskset", episode.taskset), ("task", episode.task_key), ("episode", str(episode.episode_index)),
             ("stop", episode.stop_reason.value if episode.stop_reason else "unfinished")]
    facts += [(k, number(v)) for k, v in sorted(episode.metrics.items())]
    cells = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)
    error = _error_html(episode.error, "episode-error") if episode.error else ""
    return f'<dl class="episode-head">{cells}</dl>{error}'


def _error_html(error: TraceError, css: str = "error") -> str:
    turn = f" (turn {error.turn})" if error.turn is not None else ""
    return (f'<div class="{css}" data-kind="{escape(error.kind.value)}"><b>{escape(error.kind.value)} error</b> at '
            f'<code>{escape(error.stage)}</code>{turn}: {escape(error.message)}</div>')


def _verdict(traces: dict[str, Trace | None]) -> str:
    for member, trace in traces.items():
        if trace is None:
            continue
        reply = next((m for m in reversed(trace.messages) if m.role == "assistant"), None)
        said = public_text(reply.text).text if reply is not None else ""
        lines = [line.strip() for line in said.splitlines() if VERDICT_WORD in line.lower()]
        if lines:
            return (f'<div class="verdict" data-member="{escape(member)}"><b>{escape(member)}</b>\'s verdict: '
                    f'{escape(lines[-1][:PREVIEW_CAP])}</div>')
    return ""


def _members_table(episode: Episode, traces: dict[str, Trace | None]) -> str:
    names = sorted({k for m in episode.members for k in episode.member_metrics.get(m, {})})
    head = "".join(f"<th>{escape(n)}</th>" for n in ["member", "model", "trains", "reward", "outcome", *names])
    rows = []
    for m in episode.members:
        outcome = episode.outcomes.get(m)
        metrics = episode.member_metrics.get(m, {})
        trace = traces[m]
        cells = [m, episode.models.get(m, trace.model if trace else ""),
                 "yes" if episode.trainable.get(m) else "no", number(episode.rewards.get(m)),
                 outcome.value if outcome else "—", *(number(metrics.get(n)) for n in names)]
        rows.append(f'<tr data-member="{escape(m)}">' + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    return f'<table class="members-table"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _column(episode: Episode, member: str, trace: Trace | None, reader: str | None) -> str:
    reward, outcome = episode.rewards.get(member), episode.outcomes.get(member)
    head = (f'<div class="member-head"><b>{escape(member)}</b> · reward <span class="reward">{number(reward)}'
            f'</span>' + (f' · <span class="outcome">{escape(outcome.value)}</span>' if outcome else "") + "</div>")
    if trace is None:
        return f'<div class="member" data-member="{escape(member)}">{head}<p class="empty">No trace recorded for ' \
               f'this member.</p></div>'
    body = [_error_html(e) for e in trace.errors]
    for node in trace.graph.path():
        html = message_html(node.message, node, reader=reader)
        speaker = node.message.name if node.message.role == "user" and node.message.name in episode.members else None
        if speaker and speaker != member:
            html = f'<div class="said" data-from="{escape(speaker)}">{html}</div>'
        body.append(html)
    return f'<div class="member" data-member="{escape(member)}">{head}{"".join(body)}</div>'

