"""Tokens view: the exact token ids of one branch of a trace, as text pieces coloured by loss mask and logprob.

A branch's tokens are its nodes' token ids concatenated (`core.graph`): prompt tokens (mask 0) and the
tokens the model sampled (mask 1), each with its sampling logprob. Training (`train.samples`) gives loss to
the sampled tokens of each node once per trace, and none to a turn whose markup did not parse; this view shows
both: every token is a `<span class="t">`, a sampled one also `s` and a logprob bucket `l0` (p >= 0.9) to `l4`
(p < 0.1), one that carries loss in training also `loss`. Its `title` says id, text and logprob (hover, no
script needed); `data-id`, `data-lp` carry them for `viewer.js` (click). A node of more than
`TOKENS_PER_NODE` tokens shows its first and last half of that many, and in between how many are left out, with
links to the text reader of the messages they carry.

`TokenText` turns ids into text pieces; `token_text_for(model)` loads one from a model directory's
`tokenizer.json` (the `tokenizers` library: no torch, no transformers).
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from html import escape
from pathlib import Path

from tracegym.core.graph import Node
from tracegym.core.trace import Trace
from tracegym.envs.view import marked
from tracegym.models.embedded import SERVED_MODEL_NAME, default_cache_dir, is_complete
from tracegym.train.samples import trace_samples
from tracegym.view.message_view import text_parts, text_url
from tracegym.view.page import number

BUCKETS = (0.9, 0.5, 0.25, 0.1)
"""Probability floors of the logprob colours `l0` .. `l3`; a sampled token below the last one is `l4`."""
TOKENS_PER_NODE = 2_000
"""The most tokens of one node the view draws (each is a ~120-byte span): its first and its last half of it (a
70k-token tool result in the next turn's prompt, or a flood of model output, stays a bounded page)."""
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenText:
    """Text pieces of token ids from each id's raw bytes, decoded as one UTF-8 stream: a character split across
    tokens shows on the token that completes it (the others show ''), and the pieces join to the decoded text.

    >>> TokenText({1: b"h", 2: b"\\xc3", 3: b"\\xa9"}).pieces([1, 2, 3, 9])
    ['h', '', 'é', None]
    """

    def __init__(self, vocab: Mapping[int, bytes], special: Collection[int] = ()) -> None:
        self.vocab = vocab
        """Each id's raw bytes."""
        self.special = frozenset(special)
        """Ids of control tokens (`<|im_start|>`): shown as themselves, marked."""

    def pieces(self, ids: Sequence[int]) -> list[str | None]:
        """The text piece of each id; None for an id the vocabulary does not have."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        out: list[str | None] = []
        for token in ids:
            raw = self.vocab.get(token)
            if raw is None:
                out.append(None)
                decoder.reset()  # a character cut by the unknown id is dropped, not glued across it
                continue
            out.append(decoder.decode(raw))
        return out


def token_text_for(model: str) -> TokenText | None:
    """The TokenText of `model`: a model directory with a `tokenizer.json`; the embedded model's name (its
    converted directory, when it has been made; never made here); a Hugging Face hub id in the local hub cache
    (`$HF_HUB_CACHE`, `$HF_HOME/hub`, `~/.cache/huggingface/hub`). None when none is found or the file does not
    load (the view then shows ids without text). Cached per name."""
    path = _tokenizer_file(model)
    return _load(str(path)) if path is not None else None


def _tokenizer_file(model: str) -> Path | None:
    candidates = [Path(model).expanduser() / "tokenizer.json"] if model else []
    if model == SERVED_MODEL_NAME and is_complete(default_cache_dir()):
        candidates.append(default_cache_dir() / "tokenizer.json")
    if model.count("/") == 1 and not model.startswith(("/", ".")):
        snapshots = _hub_cache() / f"models--{model.replace('/', '--')}" / "snapshots"
        candidates += sorted(snapshots.glob("*/tokenizer.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    return next((p for p in candidates if p.is_file()), None)


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else Path.home() / ".cache" / "huggingface") / "hub"


@lru_cache(maxsize=8)
def _load(path: str) -> TokenText | None:
    """The TokenText of one tokenizer.json; None when it does not load."""
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception:  # the library raises bare Exceptions for any bad file: ids shown without text
        return None
    added = tokenizer.get_added_tokens_decoder()
    byte_level = '"ByteLevel"' in json.dumps(json.loads(tokenizer.to_str()).get("decoder"))  # alone or in a Sequence
    to_bytes = _byte_level_bytes if byte_level else _sentencepiece_bytes
    vocab = {i: to_bytes(t) for t, i in tokenizer.get_vocab(with_added_tokens=False).items()}
    vocab.update({i: t.content.encode() for i, t in added.items()})  # added tokens are their own text
    return TokenText(vocab, special={i for i, t in added.items() if t.special})


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the printable character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


def _byte_level_bytes(token: str) -> bytes:
    table = _byte_decoder()
    if all(c in table for c in token):
        return bytes(table[c] for c in token)
    return token.encode()


def _sentencepiece_bytes(token: str) -> bytes:
    """A SentencePiece-style token: `▁` is a space, `<0xNN>` one byte (byte fallback), WordPiece's `##` glues."""
    match = _BYTE_TOKEN.fullmatch(token)
    if match:
        return bytes([int(match.group(1), 16)])
    return token.removeprefix("##").replace("▁", " ").encode()


def tokens_html(trace: Trace, branch: int, tokenizer: TokenText | None, *, advantage: float | None = None,
                reader: str | None = None) -> str:
    """Branch number `branch` (an index into `trace.graph.branches()`) as a `<section class="tokens-view">`: a
    summary (tokens, sampled, trained, mean sampled logprob, policy versions, `advantage` when given: an RL
    run's), a legend, then the tokens, one `<span class="seg" data-node=ID>` per node that carries any (at most
    `TOKENS_PER_NODE` of them, the others counted in a `<span class="left-out">`, linking to the text reader at
    `reader`, the trace page's URL, when given). Pieces come from `tokenizer` (None: each token shows its id).
    Raises IndexError for a branch the trace lacks."""
    branches = trace.graph.branches()
    if not 0 <= branch < len(branches):
        raise IndexError(f"trace {trace.id} has {len(branches)} branches; there is no branch {branch}")
    path = [trace.graph.nodes[i] for i in branches[branch]]
    tokenized = [n for n in path if n.token_ids]
    if not tokenized:
        return (f'<section class="tokens-view" data-branch="{branch}"><p class="empty">No token ids on this '
                "branch: the model client returned none (the token client records them).</p></section>")
    ids = [t for n in tokenized for t in n.token_ids or []]
    pieces: list[str | None] = tokenizer.pieces(ids) if tokenizer is not None else [None] * len(ids)
    loss, why_not = _loss_mask(trace, branch)
    segments, start, carried = [], 0, []
    for node in path:
        carried.append(node)  # a node's tokens render the messages since the last node that had tokens
        if not node.token_ids:
            continue
        count = len(node.token_ids)
        left_out = _left_out(node, carried, reader) if count > TOKENS_PER_NODE else ""
        segments.append(_segment(node, pieces[start : start + count], loss[start : start + count] if loss else None,
                                 tokenizer, left_out))
        start, carried = start + count, []
    summary = _summary(trace, path, ids, loss, why_not, advantage, tokenizer)
    return (f'<section class="tokens-view" data-branch="{branch}">{summary}{_LEGEND}'
            f'<div class="tokens">{"".join(segments)}</div></section>')


def _loss_mask(trace: Trace, branch: int) -> tuple[list[bool] | None, str | None]:
    """Training's loss mask for the branch, or None and why training refuses this trace."""
    try:
        samples = trace_samples(trace)
    except ValueError as exc:
        return None, str(exc)
    mask = next((s.loss_mask for s in samples if s.branch == branch), None)
    return mask, None if mask is not None else "no sample"


def _segment(node: Node, pieces: list[str | None], loss: list[bool] | None, tokenizer: TokenText | None,
             left_out: str) -> str:
    """A node's tokens; `left_out` (when the node has more than TOKENS_PER_NODE) stands between their first and
    last half."""
    ids, mask, logprobs = node.token_ids or [], node.mask or [], node.logprobs or []
    version = f" data-version=\"{node.policy_version}\"" if node.policy_version is not None else ""
    label = f"node {node.id} · {node.message.role}" + (f" · policy v{node.policy_version}" if version else "")
    special = tokenizer.special if tokenizer is not None else frozenset()
    private = _private(pieces) if node.message.role == "assistant" else set()
    half = TOKENS_PER_NODE // 2
    shown = range(len(ids)) if not left_out else [*range(half), *range(len(ids) - half, len(ids))]
    spans = [_token(ids[i], pieces[i], i < len(mask) and mask[i] == 1, logprobs[i] if i < len(logprobs) else None,
                    bool(loss and loss[i]), ids[i] in special, i in private) for i in shown]
    if left_out:
        spans.insert(half, left_out)
    flag = ' data-parse-error="1"' if node.parse_error else ""
    # <wbr>: a line may break between two tokens, never inside one (unless one token is wider than the line)
    return (f'<span class="seg" data-node="{node.id}"{version}{flag}><span class="seg-mark" title="{escape(label)}">'
            f'{node.id}</span>{"<wbr/>".join(spans)}</span>')


def _left_out(node: Node, carried: list[Node], reader: str | None) -> str:
    """What stands for the middle tokens of a node over TOKENS_PER_NODE: how many, and links to the text of the
    messages its tokens carry (`carried`: the node and those since the branch's last tokenized node; of each, its
    longest text: its content, its reasoning or a tool call's arguments)."""
    count, half = len(node.token_ids or []), TOKENS_PER_NODE // 2
    said = (f"… {count - 2 * half:,} tokens of node {node.id} left out (its tokens {half + 1:,} to {count - half:,} "
            f"of {count:,})")
    if reader is not None:
        longest = [(n, max(text_parts(n.message).items(), key=lambda p: len(p[1]))) for n in carried]
        links = [f'<a href="{escape(text_url(reader, n.id, part))}">node {n.id} ({escape(n.message.role)})</a>'
                 for n, (part, text) in longest if text]
        said += f"; the text they carry: {', '.join(links)}" if links else ""
    return f'<span class="left-out" data-left-out="{count - 2 * half}">{said} …</span>'


def _private(pieces: list[str | None]) -> set[int]:
    """The positions of an assistant turn's tokens whose text lies in a `<think>` block (as `message_view` marks
    the message), found in the text the pieces join to; none without a tokenizer."""
    runs = marked("".join(p or "" for p in pieces))
    blocks, at = [], 0
    for run, private in runs:
        if private:
            blocks.append((at, at + len(run)))
        at += len(run)
    out, at = set(), 0
    for i, piece in enumerate(pieces):
        end = at + len(piece or "")
        if any(start < end and at < stop for start, stop in blocks):
            out.add(i)
        at = end
    return out


def _token(token: int, piece: str | None, sampled: bool, logprob: float | None, loss: bool, special: bool,
           private: bool = False) -> str:
    """One token's span (a long branch has tens of thousands: what does not change with the token's place is
    made once per id, in `_face`)."""
    classes, head, shown = _face(token, piece, special)
    if private:
        classes, head = f"{classes} private", f"{head} · private reasoning"
    trained = " loss" if loss else ""
    if not sampled:
        return f'<span class="t{classes}{trained}" data-id="{token}" title="{head}">{shown}</span>'
    if logprob is None or not math.isfinite(logprob):
        return f'<span class="t s{classes}{trained}" data-id="{token}" title="{head} · no logprob">{shown}</span>'
    bucket = next((i for i, floor in enumerate(_LOG_FLOORS) if logprob >= floor), len(_LOG_FLOORS))
    lp = f"{logprob:.4f}"
    title = f"{head} · logprob {lp} · p {math.exp(min(logprob, 0.0)):.3f}" + (" · trained" if loss else "")
    return (f'<span class="t s l{bucket}{classes}{trained}" data-id="{token}" data-lp="{lp}" title="{title}">'
            f"{shown}</span>")


@lru_cache(maxsize=1 << 16)
def _face(token: int, piece: str | None, special: bool) -> tuple[str, str, str]:
    """A token's extra classes, its escaped title head (id and text) and its escaped text."""
    classes = (" sp" if special else "") + (" raw" if piece is None else " part" if piece == "" else "")
    head = f"id {token}" if piece is None else escape(f"id {token} · {piece!r}")
    return classes, head, escape(f"[{token}]" if piece is None else piece)


_LOG_FLOORS = [math.log(p) for p in BUCKETS]
_LEGEND = ('<p class="legend"><span class="t">prompt</span> <span class="t s l0">sampled p≥0.9</span> '
           '<span class="t s l1">p≥0.5</span> <span class="t s l2">p≥0.25</span> <span class="t s l3">p≥0.1</span> '
           '<span class="t s l4">p&lt;0.1</span> <span class="t s l0 loss">trained (carries loss)</span> '
           '<span class="t s l0 private">private reasoning (&lt;think&gt;)</span></p>')


def _summary(trace: Trace, path: list[Node], ids: list[int], loss: list[bool] | None, why_not: str | None,
             advantage: float | None, tokenizer: TokenText | None) -> str:
    sampled = [lp for n in path if n.token_ids for m, lp in zip(n.mask or [], n.logprobs or [], strict=False) if m]
    count = sum(sum(n.mask or []) for n in path)
    rows = [("tokens", str(len(ids))), ("sampled", str(count))]
    rows.append(("trained", str(sum(loss))) if loss is not None else ("trained", f"none ({why_not})"))
    if sampled:
        rows.append(("mean sampled logprob", number(sum(sampled) / len(sampled))))
    versions = sorted({n.policy_version for n in path if n.sampled and n.policy_version is not None})
    if versions:
        rows.append(("policy version", ", ".join(map(str, versions))))
    if advantage is not None:
        rows.append(("advantage", number(advantage)))
    if trace.is_truncated:
        rows.append(("truncated", "the last turn ran out of context or completion budget"))
    if tokenizer is None:
        rows.append(("text", "no tokenizer found for model " + (trace.model or "(unnamed)") + ": ids shown"))
    cells = "".join(f'<dt>{escape(k)}</dt><dd data-key="{escape(k)}">{number(v)}</dd>' for k, v in rows)
    return f'<dl class="tokens-summary">{cells}</dl>'
