"""Trace page: one rollout as the model saw it (system, user, assistant, tool calls and results, environment
responses), its rewards, metrics and errors with their stage, and the timeline, graph and tokens fragments."""

from __future__ import annotations

import datetime
import json
from html import escape
from typing import Any

from tracegym.core.trace import Trace
from tracegym.view.graph_view import graph_html
from tracegym.view.message_view import TEXT_CAP, message_html
from tracegym.view.page import fragment, key_values, note, number, section, table
from tracegym.view.timeline import timeline_svg
from tracegym.view.tokens_view import TokenText, tokens_html


def current_branch(trace: Trace) -> int:
    """The index (in `trace.branches`) of the branch that ends at the graph's head: the one the rollout was on."""
    branches = trace.branches
    return next((i for i, b in enumerate(branches) if b and b[-1] == trace.graph.head), 0)


def trace_page(trace: Trace, *, where: str, branch: int | None, tokenizer: TokenText | None,
               advantages: dict[int, float], json_url: str, nav: str = "", reader: str | None = None) -> str:
    """The body of a trace page. `branch` picks the branch shown (default: the current one); `advantages` holds
    the advantage each branch was trained with (an RL run), by branch index; `nav` is HTML (links to the
    neighbouring traces); `reader` is the page's own URL, under which the text reader pages a message too long
    to inline (`message_view.TEXT_CAP`)."""
    branches = trace.branches
    chosen = current_branch(trace) if branch is None else branch
    title = f"task {trace.task_key} · rollout {trace.rollout_index}" + (f" · {trace.member}" if trace.member else "")
    parts = [f"<h1>{escape(title)}</h1>",
             f'<p class="muted">{escape(where)} · <a href="{escape(json_url)}">JSON</a> {nav}</p>',
             section("Outcome", _facts(trace, advantages.get(chosen))),
             section("Rewards and metrics", _scores(trace))]
    if trace.errors:
        parts.append(section("Errors", table(["kind", "stage", "turn", "message"], [
            [f'<span class="err">{escape(e.kind.value)}</span>', escape(e.stage), number(e.turn),
             f"<pre class=raw>{escape(e.message)}</pre>"] for e in trace.errors]), id_="errors"))
    parts.append(section(f"Conversation (branch {chosen}; {len(branches)} in all)",
                         _branch_links(len(branches), chosen)
                         + _conversation(trace, branches[chosen] if branches else [], reader), id_="conversation"))
    parts.append(section("Timeline", fragment("timeline", timeline_svg, trace), id_="timeline"))
    parts.append(section("Message graph", fragment("message graph", graph_html, trace,
                                                    lambda k: f"?branch={k}#tokens", tokenizer, reader=reader),
                         id_="graph"))
    parts.append(section("Tokens", fragment("tokens view", tokens_html, trace, chosen, tokenizer,
                                            advantage=advantages.get(chosen), reader=reader), id_="tokens"))
    parts.append(section("Task", _task(trace, json_url)))
    return "".join(parts)


def _task(trace: Trace, json_url: str) -> str:
    """The task data as indented JSON, its first TEXT_CAP characters (a huge prompt is also the first user
    message's text, paged there)."""
    data = json.dumps(trace.task.model_dump(mode="json"), indent=2)
    more = ""
    if len(data) > TEXT_CAP:
        more = (f'<div class="left-out">… {len(data) - TEXT_CAP:,} more characters not shown here ({len(data):,} '
                f'in all): the whole task is in the <a href="{escape(json_url)}">JSON</a></div>')
    return f"<details><summary>task data</summary><pre class=raw>{escape(data[:TEXT_CAP])}</pre>{more}</details>"


def _facts(trace: Trace, advantage: float | None) -> str:
    stop = (trace.stop_reason.value if trace.stop_reason else "none") + (
        f" (by {trace.stopped_by})" if trace.stopped_by else "")
    items: list[tuple[str, Any]] = [
        ("reward", trace.reward), ("stop reason", stop), ("turns", trace.num_turns),
        ("tokens in / out", f"{trace.usage.prompt_tokens} / {trace.usage.completion_tokens}"),
        ("duration (s)", trace.duration()), ("taskset", trace.taskset), ("model", trace.model),
        ("started", datetime.datetime.fromtimestamp(trace.started_at, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")),
        ("policy version", trace.policy_version)]
    if advantage is not None:
        items.append(("advantage", advantage))
    if trace.sampling:
        items.append(("sampling", json.dumps(trace.sampling)))
    if trace.member:
        items.append(("member", trace.member))
    return key_values(items)


def _scores(trace: Trace) -> str:
    rewards = table(["reward", "score", "weight"], [[escape(k), number(v.score), number(v.weight)]
                                                    for k, v in trace.rewards.items()]) if trace.rewards else ""
    metrics = table(["metric", "value"], [[escape(k), number(v)] for k, v in trace.metrics.items()]) \
        if trace.metrics else ""
    return (rewards + metrics) or note("no rewards or metrics recorded")


def _branch_links(count: int, chosen: int) -> str:
    if count <= 1:
        return ""
    links = [f"<span>{i}</span>" if i == chosen else f'<a href="?branch={i}#conversation">{i}</a>'
             for i in range(count)]
    return f'<nav class="pages">branch {" ".join(links)}</nav>'


def _conversation(trace: Trace, path: list[int], reader: str | None) -> str:
    """The messages along a branch; a user message after the prompt is the environment's response."""
    parts = []
    for position, i in enumerate(path):
        node = trace.graph.nodes[i]
        html = message_html(node.message, node, reader=reader)
        if node.message.role == "user" and position >= trace.prompt_length:
            html = f'<div class="env-response"><span class="muted">environment response</span>{html}</div>'
        parts.append(html)
    return "".join(parts)
