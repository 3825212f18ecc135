"""Token check: the problems that make a trace's tokens unusable for training, found without any I/O.

A good trace either has no tokens at all or has them on every node marked sampled (a fork's copies of earlier
turns are not marked sampled: their tokens are in the next prompt); each tokenized node has a mask and logprobs
aligned with its ids (a model turn whose client returned no logprobs is reported, never read as 0.0); a model
node's ids are the new prompt tokens (mask 0, logprob 0.0) followed by its sampled completion (mask 1, finite
logprob <= 0); and each branch ends its tokens with a model turn's completion, so the branch concatenates to that turn's
prompt + completion (which `check_turn` confirms against the ids a model call actually reported).
"""

from __future__ import annotations

import math

from tracegym.core.graph import MessageGraph, Node
from tracegym.core.trace import Trace


def validate_tokens(trace: Trace) -> list[str]:
    """Every problem with the trace's tokens, one sentence each (empty: consistent, or no tokens at all)."""
    graph = trace.graph
    if not any(n.token_ids for n in graph.nodes):
        return []
    problems: list[str] = []
    for node in graph.nodes:
        if node.token_ids:
            problems += _node_problems(node)
    for leaf in graph.leaves():
        path = graph.path(leaf)
        last = max((i for i, n in enumerate(path) if n.token_ids), default=-1)
        if last >= 0 and not path[last].sampled:
            problems.append(f"branch ending at node {leaf}: its last tokens (node {path[last].id}) were not sampled")
        # a sampled node before `last` without tokens is a fork's copy written before copies were marked
        # `copy_of` (no longer sampled): its tokens are in a later prompt
        problems += [f"node {n.id}: model turn without tokens" for n in path[last + 1 :] if n.sampled]
    return problems


def _node_problems(node: Node) -> list[str]:
    ids, mask, logprobs = node.token_ids or [], node.mask, node.logprobs
    where = f"node {node.id}"
    if mask is None:
        return [f"{where}: token ids without a mask"]
    if logprobs is None:
        return [f"{where}: sampled turn without logprobs" if node.sampled else f"{where}: token ids without logprobs"]
    if len(mask) != len(ids) or len(logprobs) != len(ids):
        return [f"{where}: {len(ids)} token ids, {len(mask)} mask entries, {len(logprobs)} logprobs"]
    if any(m not in (0, 1) for m in mask):
        return [f"{where}: mask entries must be 0 or 1"]
    sampled = sum(mask)
    problems = []
    if not node.sampled and sampled:
        problems.append(f"{where}: {sampled} tokens marked sampled in a message the model did not write")
    if node.sampled and mask != [0] * (len(mask) - sampled) + [1] * sampled:
        problems.append(f"{where}: mask is not the new prompt tokens (0) followed by the sampled completion (1)")
    if any(lp != 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m):
        problems.append(f"{where}: prompt tokens carry logprobs (must be 0.0)")
    if any(not math.isfinite(lp) or lp > 1e-6 for lp, m in zip(logprobs, mask, strict=True) if m):
        problems.append(f"{where}: sampled tokens with a logprob that is not finite and <= 0")
    if node.sampled and sampled and node.temperature is None:
        problems.append(f"{where}: sampled tokens without a temperature")
    return problems


def check_turn(graph: MessageGraph, node_id: int, prompt_ids: list[int], completion_ids: list[int]) -> list[str]:
    """Problems when the branch up to model node `node_id` is not exactly the prompt + completion its model
    call reported (`ModelResponse.prompt_token_ids`, `.completion_token_ids`)."""
    node = graph.nodes[node_id]
    problems = []
    if graph.tokens(node_id) != [*prompt_ids, *completion_ids]:
        problems.append(f"node {node_id}: branch tokens differ from the call's prompt + completion")
    tail = (node.token_ids or [])[len(node.token_ids or []) - sum(node.mask or []):]
    if tail != completion_ids:
        problems.append(f"node {node_id}: sampled tokens differ from the call's completion")
    return problems
