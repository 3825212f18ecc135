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

import re
from dataclasses import dataclass

from tracegym.core.messages import Message

PRIVATE_TAG = "think"
"""The tag whose content is private by default."""


@dataclass(frozen=True)
class Public:
    """The public part of a reply, and whether its markup failed to parse."""

    text: str
    malformed: bool


def public_text(text: str, tag: str = PRIVATE_TAG) -> Public:
    """The text outside `<tag>...</tag>` blocks, stripped; malformed when a tag is unclosed, stray or nested."""
    parts = re.split(f"(</?{re.escape(tag)}>)", text)
    shown: list[str] = []
    depth, malformed = 0, False
    for part in parts:
        if part == f"<{tag}>":
            malformed |= depth > 0
            depth += 1
        elif part == f"</{tag}>":
            if depth == 0:  # reasoning with no opening tag: whatever came before may be private
                malformed = True
                shown.clear()
            else:
                depth -= 1
        elif depth == 0:
            shown.append(part)
    return Public(" ".join(p.strip() for p in shown if p.strip()), malformed or depth > 0)


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
    opening, closing = f"<{tag}>", f"</{tag}>"
    runs: list[tuple[str, bool]] = []
    depth = 0
    for part in re.split(f"(</?{re.escape(tag)}>)", text):
        if part == opening:
            depth += 1
        elif part == closing:
            if depth == 0:  # a stray closing tag: everything before it is private, as public_text hides it
                runs = [(run, True) for run, _ in runs]
            depth = max(depth - 1, 0)
        if part:
            runs.append((part, depth > 0 or part == closing))
    return runs
