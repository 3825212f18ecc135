"""Samples: a trace's branches flattened into training samples (token ids, loss mask, sampler logprobs).

One sample per branch whose tokens are known. A node shared by several branches carries loss only in the
first sample that holds it (its tokens stay in later samples as context, mask off). A truncated rollout
still yields its sampled tokens (they were sampled; only the turn's end is missing): its samples carry
`meta["truncated"] = 1.0` so a trainer may drop or mask them. Advantages are set later, by the orchestrator.
"""

from __future__ import annotations

from tracegym.core.graph import Node
from tracegym.core.sample import Sample
from tracegym.core.token_check import validate_tokens
from tracegym.core.trace import Trace


def trace_samples(trace: Trace) -> list[Sample]:
    """The trace's training samples, one per branch with tokens, in branch order."""
    nodes = trace.graph.nodes
    trained: set[int] = set()
    samples = []
    for index, branch in enumerate(trace.graph.branches()):
        path = [nodes[i] for i in branch]
        if not any(n.token_ids for n in path):
            continue
        samples.append(_branch_sample(trace, index, path, trained))
        trained.update(branch)
    return samples


def _branch_sample(trace: Trace, index: int, path: list[Node], trained: set[int]) -> Sample:
    token_ids: list[int] = []
    loss_mask: list[bool] = []
    logprobs: list[float] = []
    temperature = 1.0
    for node in path:
        ids = node.token_ids
        if not ids:
            continue
        token_ids += ids
        if node.sampled and node.id not in trained and node.mask is not None and node.logprobs is not None:
            loss_mask += [m == 1 for m in node.mask]
            logprobs += node.logprobs
            temperature = node.temperature if node.temperature is not None else temperature
        else:
            loss_mask += [False] * len(ids)
            logprobs += [0.0] * len(ids)
    meta = {"truncated": 1.0} if trace.is_truncated else {}
    return Sample.model_construct(  # built aligned here; skipping validation keeps this linear and fast
        token_ids=token_ids, loss_mask=loss_mask, logprobs=logprobs, advantage=0.0, temperature=temperature,
        reward=trace.reward, policy_version=trace.policy_version, trace_id=trace.id, branch=index,
        task_key=trace.task_key, meta=meta,
    )


def validate(trace: Trace) -> list[str]:
    """Every reason the trace cannot be trained on as it is: missing or inconsistent tokens, a sampled turn
    with no logprobs, mixed temperatures on one branch. Empty means `trace_samples` is exact."""
    problems = validate_tokens(trace)
    if not any(n.token_ids for n in trace.graph.nodes):
        problems.append("no token ids: the trace came from a client that returned none (use the token client)")
    for index, branch in enumerate(trace.graph.branches()):
        temperatures = {trace.graph.nodes[i].temperature for i in branch if trace.graph.nodes[i].token_ids
                        and trace.graph.nodes[i].sampled}
        if len(temperatures) > 1:
            problems.append(f"branch {index}: turns sampled at different temperatures {sorted(map(str, temperatures))}")
    return [f"trace {trace.id}: {p}" for p in problems]
