"""Samples: a trace's branches flattened into training samples (token ids, loss mask, sampler logprobs).

One sample per branch whose tokens are known. A node shared by several branches carries loss only in the
first sample that holds it (its tokens stay in later samples as context, mask off). A truncated rollout
still yields its sampled tokens (they were sampled; only the turn's end is missing): its samples carry
`meta["truncated"] = 1.0` so a trainer may drop or mask them. A turn whose markup did not parse (`Node.parse_error`)
stays in its samples as context, with no loss. A sample carries the image runs of its nodes (`Sample.images`,
offsets into its tokens, each image by its hash), from which the trainer computes the images' features. Advantages
are set later, by the orchestrator.

`validate` says whether a trace can be trained on; `trace_samples` refuses (ValueError) the turns whose loss
cannot be computed: sampled tokens without logprobs (never read as 0.0) or sampled at a temperature <= 0.
A greedy (temperature 0) turn's logprobs are not those of a sampling policy, so its importance ratios would
be meaningless, and the trainer divides its logits by the temperature: train at a temperature > 0.
"""

from __future__ import annotations

from tracegym.core.graph import ImageSpan, Node, RoutedExperts
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


def checked_samples(trace: Trace) -> tuple[list[Sample], list[str]]:
    """(the trace's samples, []) when `validate` passes it; else ([], its problems). A rollout that failed
    before any model turn had tokens gives ([], []): it has nothing to train on and its error is reported."""
    if trace.errors and not any(n.token_ids for n in trace.graph.nodes):
        return [], []
    problems = validate(trace)
    return ([], problems) if problems else (trace_samples(trace), [])


def _branch_sample(trace: Trace, index: int, path: list[Node], trained: set[int]) -> Sample:
    token_ids: list[int] = []
    loss_mask: list[bool] = []
    logprobs: list[float] = []
    images: list[ImageSpan] = []
    temperature = 1.0
    for node in path:
        ids = node.token_ids
        if not ids:
            continue
        images += [span.model_copy(update={"offset": len(token_ids) + span.offset}) for span in node.images]
        token_ids += ids
        if node.sampled and node.id not in trained and node.mask is not None and not node.parse_error:
            _check_trainable(trace, node)
            loss_mask += [m == 1 for m in node.mask]
            logprobs += node.logprobs or []
            temperature = node.temperature if node.temperature is not None else temperature
        else:
            loss_mask += [False] * len(ids)
            logprobs += [0.0] * len(ids)
    meta = {"truncated": 1.0} if trace.is_truncated else {}
    routed = _branch_routing(path)
    version = trace.graph.oldest_version(path)  # the oldest weights that sampled this branch
    return Sample.model_construct(  # built aligned here; skipping validation keeps this linear and fast
        token_ids=token_ids, loss_mask=loss_mask, logprobs=logprobs, advantage=0.0, temperature=temperature,
        reward=trace.reward, policy_version=version, trace_id=trace.id, branch=index,
        task_key=trace.task_key, meta=meta, routed_experts=routed, images=images,
    )


def _branch_routing(path: list[Node]) -> RoutedExperts | None:
    """The sampler's experts along the branch (`[]` on tokens of nodes without them); None when no node has any."""
    if not any(n.routed_experts for n in path):
        return None
    out: RoutedExperts = []
    for node in path:
        if node.token_ids:
            out += node.routed_experts or [[] for _ in node.token_ids]
    return out


def _check_trainable(trace: Trace, node: Node) -> None:
    """Raise when the sampled turn's tokens cannot carry loss (`validate` reports the same)."""
    problem = f"node {node.id}: sampled turn without logprobs" if node.logprobs is None else _greedy(node)
    if problem:
        raise ValueError(f"trace {trace.id}: {problem}; `validate` reports such traces, drop them before training")


def _greedy(node: Node) -> str | None:
    """The problem with a turn sampled at temperature <= 0, if this is one."""
    if not (node.sampled and node.token_ids and node.temperature is not None and node.temperature <= 0):
        return None
    return (f"node {node.id}: sampled at temperature {node.temperature} (greedy): its logprobs are no sampling "
            "policy's, so it cannot be trained on; sample at a temperature > 0")


def validate(trace: Trace) -> list[str]:
    """Every reason the trace cannot be trained on as it is: missing or inconsistent tokens, a sampled turn
    with no logprobs, a turn sampled at temperature <= 0, mixed temperatures on one branch. Empty means
    `trace_samples` is exact."""
    problems = validate_tokens(trace)
    if not any(n.token_ids for n in trace.graph.nodes):
        problems.append("no token ids: the trace came from a client that returned none (use the token client)")
    problems += [p for p in map(_greedy, trace.graph.nodes) if p]
    for index, branch in enumerate(trace.graph.branches()):
        temperatures = {trace.graph.nodes[i].temperature for i in branch if trace.graph.nodes[i].token_ids
                        and trace.graph.nodes[i].sampled}
        if len(temperatures) > 1:
            problems.append(f"branch {index}: turns sampled at different temperatures {sorted(map(str, temperatures))}")
    return [f"trace {trace.id}: {p}" for p in problems]
