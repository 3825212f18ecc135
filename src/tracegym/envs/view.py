"""View: what one member of an episode sees of the others: their public output, attributed, never their
private reasoning.

A reply's private reasoning is what sits inside `<think>...</think>` (or the model's separate
`reasoning_content`, which is never read here). Only the rest is public. Markup that does not parse hides more,
never less: an unclosed `<think>` hides everything after it, a stray `</think>` everything before it, and either
marks the reply malformed (its turn stands, flagged, and is not trained on).

>>> public_text("<think>fold? no</think>bet")
Public(text='bet', malformed=False)
>>> public_text("check <think>they bluff")
Public(text='check', malformed=True)
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from tracegym.core.messages import Message

PRIVATE_TAG = "think"
"""The tag whose content is private by default."""


@dataclass(frozen=True, slots=True)
class Public:
    """The public part of a reply, and whether its markup failed to parse."""

    text: str
    malformed: bool


def public_text(text: str, tag: str = PRIVATE_TAG) -> Public:
    """The text outside `<tag>...</tag>` blocks, stripped; malformed when a tag is unclosed, stray or nested."""
    pattern, opening, closing = _markup(tag)
    if closing[2:] not in text:  # neither tag occurs: all of it is public (every reply of a model that never thinks)
        return Public(text.strip(), False)
    start, end = text.find(opening), text.find(closing)
    if 0 <= start < end and text.count(opening) == 1 and text.count(closing) == 1:  # one block: a thinking model's
        before, after = text[:start].strip(), text[end + len(closing):].strip()  # well-formed reply, read as below
        return Public(f"{before} {after}" if before and after else before or after, False)
    shown: list[str] = []
    depth, malformed = 0, False
    for part in pattern.split(text):
        if part == opening:
            malformed |= depth > 0
            depth += 1
        elif part == closing:
            if depth == 0:  # reasoning with no opening tag: whatever came before may be private
                malformed = True
                shown.clear()
            else:
                depth -= 1
        elif depth == 0:
            shown.append(part)
    return Public(" ".join(s for s in (p.strip() for p in shown) if s), malformed or depth > 0)


@functools.cache
def _markup(tag: str) -> tuple[re.Pattern[str], str, str]:
    """The pattern that splits a reply at `tag`'s markup, and its opening and closing tags (built once a tag)."""
    return re.compile(f"(</?{re.escape(tag)}>)"), f"<{tag}>", f"</{tag}>"


def attributed(member: str, text: str) -> Message:
    """Another member's public output as a user message in a view: its text prefixed by who said it."""
    return Message(role="user", content=f"[{member}] {text}", name=member)


def marked(text: str, tag: str = PRIVATE_TAG) -> list[tuple[str, bool]]:
    """The reply as runs of (text, private) in order, the tags inside the private runs, by `public_text`'s rules
    (its text is the public runs, stripped and joined): for a viewer that shows a whole reply, its private part
    marked.

    >>> marked("<think>fold?</think>bet")
    [('<think>', True), ('fold?', True), ('</think>', True), ('bet', False)]
    """
    pattern, opening, closing = _markup(tag)
    runs: list[tuple[str, bool]] = []
    depth = 0
    for part in pattern.split(text):
        if part == opening:
            depth += 1
        elif part == closing:
            if depth == 0:  # a stray closing tag: everything before it is private, as public_text hides it
                runs = [(run, True) for run, _ in runs]
            depth = max(depth - 1, 0)
        if part:
            runs.append((part, depth > 0 or part == closing))
    return runs
