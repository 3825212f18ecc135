"""Graph view: a trace's message graph as HTML: each branch (root-to-leaf path), where it forks from an earlier
one and why, read from what the graph records.

A graph forks in three ways (`core.graph`, `envs.proxy`), each told apart here by its shape:
- `retokenized`: a model turn's prompt did not extend the branch's exact tokens (the chat template rendered an
  earlier turn differently, or an agent program changed its tools), so the conversation was copied, without
  tokens, into a new root and the new model node carries the whole prompt: the copy starts right after the
  head it copied, and this view names the first token where the two renders differ.
- `rewritten`: an agent program sent a history that leaves an earlier branch after some message (edited,
  dropped or compacted turns): the new branch shares the nodes up to there and goes on from a sibling.
- `resampled`: a program sent a conversation it had sent before: the reply is a sibling of the earlier one.
A new root whose messages are not a copy is a `new-conversation` (nothing in common with the earlier branches).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from html import escape

from tracegym.core.graph import MessageGraph, Node
from tracegym.core.messages import Message
from tracegym.core.trace import Trace
from tracegym.envs.proxy import same_message
from tracegym.envs.view import public_text
from tracegym.view.message_view import PREVIEW_CAP, message_html, one_line, snippet_html
from tracegym.view.tokens_view import TokenText

SNIPPET = 100
"""Characters of a message shown on its collapsed line."""


@dataclass(frozen=True)
class Fork:
    """Where and why branch `branch` leaves an earlier branch `source`."""

    branch: int
    node: int
    """Its first node of its own."""
    kind: str
    """`retokenized`, `rewritten`, `resampled` or `new-conversation` (see the module docstring)."""
    source: int | None
    """The earlier branch it leaves (None for a new conversation)."""
    shared: int
    """How many of its first nodes it shares with `source` (0 for a new root)."""
    reason: str


def forks(graph: MessageGraph, tokenizer: TokenText | None = None) -> list[Fork]:
    """The fork of every branch but the first, in branch order (`graph.branches()`); `tokenizer` adds the text
    of the tokens where a retokenized fork's renders part."""
    branches = graph.branches()
    out = []
    for k in range(1, len(branches)):
        earlier = {i: j for j in range(k - 1, -1, -1) for i in branches[j]}  # node -> earliest branch holding it
        shared = next((d for d, i in enumerate(branches[k]) if i not in earlier), len(branches[k]))
        own = graph.nodes[branches[k][min(shared, len(branches[k]) - 1)]]
        if own.parent is not None:
            out.append(_sibling_fork(graph, k, own, earlier[own.parent], shared, branches))
        else:
            out.append(_root_fork(graph, k, own, branches, earlier, tokenizer))
    return out


def _sibling_fork(graph: MessageGraph, k: int, own: Node, source: int, shared: int,
                  branches: list[list[int]]) -> Fork:
    before = graph.nodes[branches[source][shared]] if shared < len(branches[source]) else None
    role = own.message.role
    if before is not None and same_message(before.message, own.message):
        return Fork(k, own.id, "resampled", source, shared,
                    f"the same conversation was sent again and answered anew: node {own.id} repeats node "
                    f"{before.id} ({role}) of branch {source}")
    was = f" where branch {source} has {before.message.role} «{one_line(_said(before.message), 60)}»" if before else ""
    return Fork(k, own.id, "rewritten", source, shared,
                f"the history was rewritten after its first {shared} messages: it goes on with {role} "
                f"«{one_line(_said(own.message), 60)}»{was}")


def _root_fork(graph: MessageGraph, k: int, root: Node, branches: list[list[int]], earlier: dict[int, int],
               tokenizer: TokenText | None) -> Fork:
    copied = graph.path(root.id - 1) if root.id > 0 else []
    mine = [graph.nodes[i] for i in branches[k]]
    is_copy = copied and len(mine) > len(copied) and all(
        a.message == b.message and not b.token_ids for a, b in zip(copied, mine, strict=False))
    if not is_copy:
        return Fork(k, root.id, "new-conversation", None, 0,
                    f"a new conversation: its first message ({root.message.role} «{one_line(_said(root.message), 60)}»)"
                    " continues no earlier branch")
    source = earlier.get(copied[-1].id, 0)
    model = next((n for n in mine[len(copied):] if n.token_ids), None)
    why = _token_drift(graph.tokens(copied[-1].id), model, tokenizer) if model else "its model turn has no tokens"
    return Fork(k, root.id, "retokenized", source, 0,
                f"the prompt of node {model.id if model else '?'} did not extend branch {source}'s tokens ({why}), "
                f"so its {len(copied)} messages were copied into a new branch whose model turn carries the whole "
                "prompt")


def _token_drift(old: list[int], node: Node, tokenizer: TokenText | None) -> str:
    """Where the branch's tokens and the new turn's prompt part."""
    new = (node.token_ids or [])[: (node.mask or []).count(0)]
    at = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), None)
    if at is not None:
        said = tokenizer.pieces([old[at], new[at]]) if tokenizer is not None else [None, None]
        before, now = (f" {p!r}" if p is not None else "" for p in said)
        return f"they differ from token {at} on: id {old[at]}{before} before, id {new[at]}{now} now"
    return f"the new prompt has {len(new)} tokens where the branch had {len(old)}"


def graph_html(trace: Trace, branch_href: Callable[[int], str] | None = None,
               tokenizer: TokenText | None = None, *, reader: str | None = None) -> str:
    """The message graph of `trace` as a `<section class="graph">`: one `<div class="branch" data-branch=K>` per
    branch (K as in `trace.graph.branches()`, the current one marked `data-current`), each listing the nodes it
    does not share with an earlier branch as collapsed `<details class="node">` (the message inside, each of its
    texts cut at `PREVIEW_CAP` characters, linking to the text reader at `reader`, the trace page's URL).
    A branch that forks opens with `<div class="fork" data-fork=KIND data-from-branch=J data-node=ID>` saying
    why (`forks`; with `tokenizer`, the differing tokens' text too). `branch_href(K)`, when given, links each
    branch (to its tokens view)."""
    graph = trace.graph
    if not graph.nodes:
        return '<section class="graph"><p class="empty">The message graph is empty.</p></section>'
    branches = graph.branches()
    by_branch = {f.branch: f for f in forks(graph, tokenizer)}
    head = graph.head
    seen: set[int] = set()
    parts = []
    for k, ids in enumerate(branches):
        own = [i for i in ids if i not in seen]
        parts.append(_branch_html(graph, k, ids, own, by_branch.get(k), head in ids, branch_href, reader))
        seen.update(ids)
    count = f"{len(branches)} branches" if len(branches) > 1 else "1 branch"
    summary = f'<p class="graph-summary">{count}, {len(graph.nodes)} nodes</p>'
    return f'<section class="graph">{summary}{"".join(parts)}</section>'


def _branch_html(graph: MessageGraph, k: int, ids: list[int], own: list[int], fork: Fork | None, current: bool,
                 branch_href: Callable[[int], str] | None, reader: str | None) -> str:
    nodes = [graph.nodes[i] for i in ids]
    tokens = sum(len(n.token_ids or []) for n in nodes)
    sampled = sum(sum(n.mask or []) for n in nodes)
    title = f"branch {k}"
    if branch_href is not None:
        title = f'<a href="{escape(branch_href(k))}">{title}</a>'
    facts = [f"{len(ids)} nodes", f"{tokens} tokens ({sampled} sampled)"]
    version = graph.oldest_version(nodes)
    if version is not None:
        facts.append(f"policy v{version}")
    if current:
        facts.append("current")
    head = f'<div class="branch-head">{title} · {" · ".join(facts)}</div>'
    body = []
    if fork is not None:
        source = f' data-from-branch="{fork.source}"' if fork.source is not None else ""
        body.append(f'<div class="fork" data-fork="{fork.kind}"{source} data-node="{fork.node}">'
                    f'<span class="fork-mark">↳ fork: {escape(fork.kind)}</span> {escape(fork.reason)}</div>')
    if len(own) < len(ids):
        last_shared = ids[len(ids) - len(own) - 1]
        body.append(f'<p class="shared">shares nodes {ids[0]} to {last_shared} with an earlier branch</p>')
    body += [_node_html(graph.nodes[i], reader) for i in own]
    marker = ' data-current="1"' if current else ""
    return f'<div class="branch" data-branch="{k}"{marker}>{head}{"".join(body)}</div>'


def _node_html(node: Node, reader: str | None) -> str:
    flags = " · sampled" if node.sampled else ""
    if node.token_ids:
        flags += f" · {len(node.token_ids)} tokens"
    if node.parse_error:
        flags += " · parse error"
    line = (f'<span class="role">{escape(node.message.role)}</span> <span class="node-id">{node.id}</span> '
            f'<span class="snippet">{_snippet_html(node)}</span>'
            f'<span class="node-flags">{escape(flags)}</span>')
    return f'<details class="node role-{escape(node.message.role)}" data-node="{node.id}"><summary>{line}</summary>' \
           f'{message_html(node.message, node, cap=PREVIEW_CAP, reader=reader)}</details>'


def _snippet_html(node: Node) -> str:
    if node.message.text:
        return snippet_html(node.message, SNIPPET)
    return escape(one_line(_calls(node), SNIPPET))


def _said(message: Message) -> str:
    """A message's text for a fork's reason, which is plain text: an assistant's without its private runs."""
    return public_text(message.text).text if message.role == "assistant" else message.text


def _calls(node: Node) -> str:
    return ", ".join(f"{c.name}({c.arguments})" for c in node.message.tool_calls)


