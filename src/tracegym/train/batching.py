"""Micro-batches: training samples laid out in rows (a shared prompt once), packed by a token budget, collated.

A group's rollouts start with the same prompt. `rows` puts samples that share their prompt (every token before
the first loss token) and temperature in one row: the prompt once, then each sample's own tokens, each attending
to the prompt and to itself only (a 4-D attention mask), with positions that restart after the prompt for every
sample. The model's numbers are the same as with one row per sample, and the prompt is computed once instead of
once per rollout (a reverse-text step of 4 x 4 rollouts: 33% fewer tokens). A sample alone in its row is laid out
exactly as it was before sharing: the whole sample, left-padded, with a 2-D mask.

Padding, not concatenation of unrelated samples: packing them into one row with restarting positions isolates
them only under attention kernels that read sequence boundaries, so rows are left-padded to the longest in the
micro-batch and the budget counts padded tokens (rows x longest row), which is what memory and compute scale
with; rows are sorted by length before they are cut into micro-batches, to keep the padding small.

Left padding puts every row's sampled tokens at the right edge, so the trainer asks the model for logits of only
the last `keep` positions (`logits_to_keep`) instead of the whole sequence times a 49k-word vocabulary. Each
target token (a token whose logprob the loss needs) names the kept position whose logits predict it (`sources`):
the position before it in its own sample, or the prompt's last position for a sample's first sampled token.

Samples with images (`Sample.images`) share a row only with those that show the same images in their shared
prompt (placeholder runs alone are the same tokens for every image); a micro-batch names its images in the order
their runs appear in its rows, row after row (`MicroBatch.images`), the order the trainer fills them in.

With several trainer ranks, `balance` first deals the step's rows out so every rank gets about as many tokens
(what its compute scales with); each rank then packs its share. A rank with fewer micro-batches than the others
runs `idle` ones (no loss tokens), since every rank must take part in each forward and backward of a sharded model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol, TypeVar

import torch

from tracegym.core.sample import Sample


class Sized(Protocol):
    def __len__(self) -> int: ...


Item = TypeVar("Item", bound=Sized)


@dataclass(frozen=True)
class Row:
    """Samples trained in one row: their first `shared` tokens (the prompt they share) once, then each one's rest.
    A sample alone has `shared = len(sample)`: the row is the sample."""

    samples: tuple[Sample, ...]
    shared: int

    def __len__(self) -> int:
        return self.shared + sum(len(s) - self.shared for s in self.samples)

    @classmethod
    def alone(cls, sample: Sample) -> Row:
        return cls((sample,), len(sample))


def prompt_length(sample: Sample) -> int:
    """Tokens before the sample's first loss token (all of them when none carries loss)."""
    return next((i for i, m in enumerate(sample.loss_mask) if m), len(sample))


def rows(samples: Sequence[Sample], token_budget: int, share: bool = True) -> list[Row]:
    """The samples in rows: with `share`, those with the same prompt tokens and temperature share a row, cut so
    that a row stays within `token_budget` where its samples allow; else one row per sample. Every sample lands in
    exactly one row."""
    if not share:
        return [Row.alone(s) for s in samples]
    groups: dict[tuple[float, tuple[int, ...], tuple[str, ...]], list[Sample]] = {}
    out: list[Row] = []
    for sample in samples:
        prompt = prompt_length(sample)
        if 0 < prompt < len(sample):
            key = (sample.temperature, tuple(sample.token_ids[:prompt]), _images_before(sample, prompt))
            groups.setdefault(key, []).append(sample)
        else:
            out.append(Row.alone(sample))
    for (_, prompt_ids, _), members in groups.items():
        current: list[Sample] = []
        for sample in members:
            if current and len(Row((*current, sample), len(prompt_ids))) > token_budget:
                out.append(_row(current, len(prompt_ids)))
                current = []
            current.append(sample)
        out.append(_row(current, len(prompt_ids)))
    return out


def _images_before(sample: Sample, end: int) -> tuple[str, ...]:
    """The hashes of the sample's images whose runs lie before token `end` (a ValueError for a run across it)."""
    if any(span.offset < end < span.offset + span.length for span in sample.images):
        raise ValueError(f"trace {sample.trace_id}: an image run crosses the prompt's end (token {end})")
    return tuple(span.sha256 for span in sample.images if span.offset < end)


def row_images(row: Row) -> list[str]:
    """The hashes of the images in a row, in the order their runs appear: the shared prompt's, then each sample's
    own."""
    shared = list(_images_before(row.samples[0], row.shared))
    return shared + [span.sha256 for s in row.samples for span in s.images if span.offset >= row.shared]


def _row(samples: list[Sample], shared: int) -> Row:
    return Row(tuple(samples), shared) if len(samples) > 1 else Row.alone(samples[0])


def pack(items: Sequence[Item], token_budget: int) -> list[list[Item]]:
    """Cut rows (or samples; longest first) into micro-batches whose padded size `rows * longest` fits
    `token_budget`. An item longer than the budget gets a micro-batch of its own. Every item lands in exactly one."""
    if token_budget < 1:
        raise ValueError(f"token_budget must be >= 1, got {token_budget}")
    batches: list[list[Item]] = []
    current: list[Item] = []
    for item in sorted(items, key=len, reverse=True):
        longest = len(current[0]) if current else len(item)
        if current and (len(current) + 1) * longest > token_budget:
            batches.append(current)
            current = []
        current.append(item)
    if current:
        batches.append(current)
    return batches


def balance(items: Sequence[Item], ranks: int) -> list[list[Item]]:
    """Deal rows (or samples) out to `ranks` shares of about equal tokens: longest first, each to the share with
    the fewest tokens so far (ties: the lowest rank). Deterministic, so every rank computes the same split of the
    same batch; with fewer items than ranks some shares are empty."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    shares: list[list[Item]] = [[] for _ in range(ranks)]
    tokens = [0] * ranks
    for item in sorted(items, key=len, reverse=True):
        rank = min(range(ranks), key=lambda r: (tokens[r], r))
        shares[rank].append(item)
        tokens[rank] += len(item)
    return shares


@dataclass(frozen=True)
class Span:
    """Where one sample's target tokens sit: row `row`, target columns `column ..`, sample tokens `first ..`,
    `count` of them; its own (unshared) tokens start at padded position `offset`."""

    sample: Sample
    row: int
    column: int
    first: int
    count: int
    offset: int


@dataclass(frozen=True)
class MicroBatch:
    """Left-padded rows (tensors [B, T]) and the target tokens the loss needs (tensors [B, K], one column per
    target token, padded with masked columns)."""

    input_ids: torch.Tensor
    """[B, T] token ids, padded on the left."""
    attention_mask: torch.Tensor
    """[B, T] 1 for real tokens, 0 for padding; or, when a row holds several samples, [B, 1, T, T] True where a
    token may attend to another (earlier in its own sample or in the shared prompt)."""
    position_ids: torch.Tensor
    """[B, T] positions counted from each sample's first token (0 on padding)."""
    sources: torch.Tensor
    """[B, K] the kept position (0 .. keep - 1) whose logits predict each target token."""
    target_ids: torch.Tensor
    """[B, K] the target tokens."""
    loss_mask: torch.Tensor
    """[B, K] True for targets that carry loss (never a sample's first token: no logits predict it)."""
    sampler_logprobs: torch.Tensor
    """[B, K] the sampler's logprob of each target (0 where no loss)."""
    advantages: torch.Tensor
    """[B, K] the advantage of each target (a sample's `token_advantages`, else its `advantage`)."""
    temperatures: torch.Tensor
    """[B] the sampling temperature of each row (a row's samples share it)."""
    keep: int
    """Logits are needed for the last `keep` positions only."""
    spans: tuple[Span, ...] = ()
    """Each sample's targets (host-side bookkeeping for `Trainer.logprobs`)."""
    routed_experts: torch.Tensor | None = None
    """[B, T, L, K] the sampler's experts per position and MoE layer (-1: route freely), when samples carry them."""
    images: tuple[str, ...] = ()
    """The sha256 of each image whose placeholder run is in the rows, in the order the runs appear (row by row)."""

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: torch.device) -> MicroBatch:
        """The same micro-batch with its tensors on `device`."""
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self)
                 if f.name not in ("keep", "spans", "routed_experts", "images")}
        routed = None if self.routed_experts is None else self.routed_experts.to(device)
        return MicroBatch(**moved, keep=self.keep, spans=self.spans, routed_experts=routed, images=self.images)


def collate(items: Sequence[Row | Sample], pad_id: int = 0) -> MicroBatch:
    """Left-pad rows (a bare sample is a row of its own) into one MicroBatch; loss on a sample's first token is
    dropped (nothing predicts it)."""
    layout = [item if isinstance(item, Row) else Row.alone(item) for item in items]
    width = max(len(r) for r in layout)
    spans = [span for b, row in enumerate(layout) for span in _row_spans(row, b, width - len(row))]
    columns = max([1] + [s.column + s.count for s in spans])
    sources = [_sources(span, layout[span.row].shared, width - len(layout[span.row])) for span in spans]
    first_source = min((int(v.min()) for v in sources if len(v)), default=width - 1)
    shape = (len(layout), columns)
    targets = {"sources": torch.zeros(shape, dtype=torch.long),
               "target_ids": torch.full(shape, pad_id, dtype=torch.long),
               "loss_mask": torch.zeros(shape, dtype=torch.bool),
               "sampler_logprobs": torch.zeros(shape), "advantages": torch.zeros(shape)}
    for span, source in zip(spans, sources, strict=True):
        sample, cut, row = span.sample, slice(span.first, None), span.row
        into = slice(span.column, span.column + span.count)
        targets["sources"][row, into] = source - first_source
        targets["target_ids"][row, into] = torch.tensor(sample.token_ids[cut], dtype=torch.long)
        targets["loss_mask"][row, into] = torch.tensor(sample.loss_mask[cut], dtype=torch.bool)
        targets["sampler_logprobs"][row, into] = torch.tensor(sample.logprobs[cut], dtype=torch.float32)
        per_token = sample.token_advantages
        targets["advantages"][row, into] = (torch.tensor(per_token[cut], dtype=torch.float32) if per_token
                                            else sample.advantage)
    input_ids, positions, segments = _tokens(layout, width, pad_id)
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=_attention(segments, shared=any(len(r.samples) > 1 for r in layout)),
        position_ids=positions,
        **targets,
        temperatures=torch.tensor([r.samples[0].temperature for r in layout], dtype=torch.float32),
        keep=width - first_source,
        spans=tuple(spans),
        routed_experts=_routing(layout, width),
        images=tuple(sha for row in layout for sha in row_images(row)),
    )


def _placements(row: Row, start: int) -> list[tuple[Sample, int]]:
    """Each sample of the row with the padded position of its first own (unshared) token."""
    out, offset = [], start + row.shared
    for sample in row.samples:
        out.append((sample, offset))
        offset += len(sample) - row.shared
    return out


def _row_spans(row: Row, b: int, start: int) -> list[Span]:
    """Row `b`'s samples' targets (the row padded from position `start`): each from its first loss token (never
    token 0) to its end, one after another."""
    out, column = [], 0
    for sample, offset in _placements(row, start):
        first = max(prompt_length(sample), 1)
        count = max(len(sample) - first, 0)
        out.append(Span(sample, b, column, first, count, offset))
        column += count
    return out


def _sources(span: Span, shared: int, start: int) -> torch.Tensor:
    """The padded positions whose logits predict the span's targets: the token before each one, in the shared
    prompt (its first `shared` tokens, from `start`) or in the sample's own tokens."""
    before = torch.arange(span.first - 1, span.first - 1 + span.count)
    return torch.where(before < shared, start + before, span.offset + before - shared)


def _tokens(layout: list[Row], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, T] token ids, positions and segments (-1 padding, 0 the shared prompt, i + 1 sample i's own tokens)."""
    shape = (len(layout), width)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    segments = torch.full(shape, -1, dtype=torch.long)
    for b, row in enumerate(layout):
        start = width - len(row)
        input_ids[b, start:start + row.shared] = torch.tensor(row.samples[0].token_ids[:row.shared])
        positions[b, start:start + row.shared] = torch.arange(row.shared)
        segments[b, start:start + row.shared] = 0
        for i, (sample, offset) in enumerate(_placements(row, start)):
            own = len(sample) - row.shared
            input_ids[b, offset:offset + own] = torch.tensor(sample.token_ids[row.shared:], dtype=torch.long)
            positions[b, offset:offset + own] = torch.arange(row.shared, len(sample))
            segments[b, offset:offset + own] = i + 1
    return input_ids, positions, segments


def _routing(layout: list[Row], width: int) -> torch.Tensor | None:
    """[B, T, L, K] the samples' recorded experts laid out as `_tokens` lays out their ids (-1 on padding and on
    tokens without a record); None when no sample carries any."""
    known = next((r for row in layout for s in row.samples for r in s.routed_experts or [] if r), None)
    if known is None:
        return None
    free = [[-1] * len(known[0])] * len(known)
    out = torch.full((len(layout), width, len(known), len(known[0])), -1, dtype=torch.long)
    for b, row in enumerate(layout):
        start = width - len(row)
        for i, (sample, offset) in enumerate(_placements(row, start)):
            routed = torch.tensor([r or free for r in sample.routed_experts or [[]] * len(sample)], dtype=torch.long)
            if i == 0:
                out[b, start:start + row.shared] = routed[:row.shared]
            out[b, offset:offset + len(sample) - row.shared] = routed[row.shared:]
    return out


def _attention(segments: torch.Tensor, shared: bool) -> torch.Tensor:
    """The attention mask: [B, T] real-token mask, or with `shared` rows [B, 1, T, T]: causal, within a sample's own
    tokens or to the shared prompt; a padding position attends to itself only (a row of all False gives NaN)."""
    real = segments >= 0
    if not shared:
        return real.long()
    width = segments.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    query, key = segments[:, :, None], segments[:, None, :]
    allowed = causal & real[:, None, :] & ((key == query) | (key == 0)) & real[:, :, None]
    allowed |= torch.eye(width, dtype=torch.bool) & ~real[:, :, None]
    return allowed[:, None]


def idle(pad_id: int = 0) -> MicroBatch:
    """A micro-batch that carries no loss: what a rank runs while others still have micro-batches to train."""
    return collate([Sample(token_ids=[pad_id, pad_id], loss_mask=[False, False], logprobs=[0.0, 0.0])], pad_id)
