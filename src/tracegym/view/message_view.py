"""Message view: one chat message as escaped HTML (its role, its text with private reasoning marked, its tool
calls with their arguments, a tool result's call), the one piece every page that shows a conversation uses.

Every string from a trace goes through `html.escape`, so message text such as `<script>` is shown, never run.
A page inlines at most `TEXT_CAP` characters of each of a message's texts (`text_parts`): past it, the head,
how much more there is, and a link to the text reader (`text_reader`), which pages the whole text.
"""

from __future__ import annotations

import contextlib
import json
import re
from html import escape

from tracegym.core.graph import Node
from tracegym.core.image_ref import FORMATS, stored_name
from tracegym.core.messages import ImagePart, Message, ToolCall
from tracegym.envs.view import PRIVATE_TAG, marked

_WORD = re.compile(r"\S+")
PRIVATE_TITLE = "private reasoning: never shown to the other members"
TEXT_CAP = 100_000
"""The most characters of one message's text a page inlines, and of its reasoning and of each tool call's
arguments apart (one 70k-token tool result is ~300,000); the text reader shows a text this many a page."""
INLINE_IMAGE_CAP = 2_000_000
"""The longest data URI of an image inlined in a row that a page shows as the image (a placeholder past it)."""
PREVIEW_CAP = 10_000
"""What the graph view inlines of a node's message: the conversation on the same page inlines up to
`TEXT_CAP`, so a long message is not inlined whole twice."""


def text_parts(message: Message) -> dict[str, str]:
    """The message's texts a page may cut, by the name the text reader takes: `text` (the content's text, images
    left out), `reasoning` (its reasoning_content, when it has one), `call-K` (tool call K's arguments)."""
    parts = {"text": message.text}
    if message.reasoning_content is not None:
        parts["reasoning"] = message.reasoning_content
    parts.update({f"call-{k}": call.arguments for k, call in enumerate(message.tool_calls)})
    return parts


def page_count(chars: int) -> int:
    """How many pages of the text reader a text of `chars` characters takes (an empty text: one empty page)."""
    return max(1, -(-chars // TEXT_CAP))


def text_url(reader: str, node: int, part: str = "text", page: int = 1) -> str:
    """The text reader's page `page` of `part` (`text_parts`) of node `node`, for the trace page at `reader`
    (`/trace/3`, `/episode/0/member/judge`)."""
    return f"{reader}/node/{node}/text?page={page}" + (f"&part={part}" if part != "text" else "")


def left_out_html(part: str, chars: int, shown: int, node: Node | None, reader: str | None) -> str:
    """A `<div class="left-out">` saying how many of a text's `chars` characters are not shown after its first
    `shown`, linking (when both `node` and `reader` are given) to the reader's page where the cut falls."""
    said = f"{chars - shown:,} more characters not shown here ({chars:,} in all)"
    if node is not None and reader is not None:
        page = shown // TEXT_CAP + 1
        href = escape(text_url(reader, node.id, part, page))
        said += f': <a href="{href}">read them from page {page} of {page_count(chars)}</a>'
    return f'<div class="left-out" data-part="{part}" data-left-out="{chars - shown}">… {said}</div>'


def message_html(message: Message, node: Node | None = None, *, private_tag: str = PRIVATE_TAG,
                 cap: int = TEXT_CAP, reader: str | None = None) -> str:
    """`message` as a `<div class="msg role-ROLE">`: a head (role, name, the call a tool result answers, and for a
    graph `node`: its id, whether the model sampled it, its policy version, its token count, a parse-error
    flag) and the body. An assistant's `<think>` blocks (`private_tag`) and its `reasoning_content` are wrapped
    in `<span class="private">`; text keeps its line breaks (CSS `white-space: pre-wrap`). Of each text longer
    than `cap` characters only the head is shown, then a `left_out_html` line (a link to the text reader at
    `reader`, the trace page's URL, when given with `node`)."""
    head = [f'<span class="role">{escape(message.role)}</span>']
    if message.name:
        head.append(f'<span class="name">{escape(message.name)}</span>')
    if message.tool_call_id:
        head.append(f'<span class="answers">answers <code>{escape(message.tool_call_id)}</code></span>')
    attrs = ""
    if node is not None:
        head += _node_flags(node)
        attrs = f' data-node="{node.id}"' + (' data-parse-error="1"' if node.parse_error else "")
    body = []
    if message.reasoning_content:
        reasoning = message.reasoning_content
        body.append(f'<div class="private" title="{PRIVATE_TITLE}">{escape(reasoning[:cap])}</div>')
        body.append(_left_out("reasoning", reasoning, cap, node, reader))
    text = _text_html(message, private_tag, cap)
    if text:
        body.append(f'<div class="msg-text">{text}</div>')
    body.append(_left_out("text", message.text, cap, node, reader))
    body += [_call_html(call, _left_out(f"call-{k}", call.arguments, cap, node, reader), cap)
             for k, call in enumerate(message.tool_calls)]
    return (f'<div class="msg role-{escape(message.role)}"{attrs}><div class="msg-head">{" ".join(head)}</div>'
            f'{"".join(body)}</div>')


def _node_flags(node: Node) -> list[str]:
    flags = [f'<span class="node-id">node {node.id}</span>']
    if node.sampled:
        flags.append('<span class="flag sampled">sampled</span>')
    if node.copy_of is not None:
        flags.append(f'<span class="flag copy" title="a fork copied it here: its tokens are in the next prompt">'
                     f'copy of node {node.copy_of}</span>')
    if node.policy_version is not None:
        flags.append(f'<span class="flag version">policy v{node.policy_version}</span>')
    if node.token_ids:
        flags.append(f'<span class="flag ntok">{len(node.token_ids)} tokens</span>')
    if node.parse_error:
        flags.append('<span class="flag parse-error" title="its markup did not parse: the turn stands, '
                     'with no loss">parse error</span>')
    return flags


def snippet_html(message: Message, limit: int, *, private_tag: str = PRIVATE_TAG) -> str:
    """The message's text on one line, cut to `limit` characters, its private runs marked as in `message_html`
    (a collapsed line of a list of messages)."""
    out, left = [], limit
    for run, private in _runs(message, private_tag):
        if left <= 0:
            break
        flat = one_line(run, left)
        if flat:
            left -= len(flat) + 1
            out.append(_run_html(flat, private))
    return " ".join(out)


def one_line(text: str, limit: int) -> str:
    """`text`'s words joined by single spaces, cut to `limit` characters (its last one then "…"); it reads the
    text only as far as the line needs (a snippet of a 150 MB message costs what one of a short one does)."""
    words, size = [], 0
    for word in _WORD.finditer(text):
        words.append(word.group())
        size += len(words[-1]) + 1
        if size > limit + 1:  # the words joined are longer than the line: it is cut
            break
    flat = " ".join(words)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _left_out(part: str, text: str, cap: int, node: Node | None, reader: str | None) -> str:
    return left_out_html(part, len(text), cap, node, reader) if len(text) > cap else ""


def _text_html(message: Message, private_tag: str, cap: int) -> str:
    """The content's first `cap` characters, private runs marked on an assistant's text; images as `_image_html`
    shows them."""
    if isinstance(message.content, list):
        parts, left = [], cap
        for p in message.content:
            if isinstance(p, ImagePart):
                parts.append(_image_html(p))
            elif left > 0:
                parts.append(escape(p.text[:left]))
                left -= len(p.text)
        return "".join(parts)
    return "".join(_run_html(run, private) for run, private in _head(_runs(message, private_tag), cap))


def _head(runs: list[tuple[str, bool]], cap: int) -> list[tuple[str, bool]]:
    """The runs cut to their first `cap` characters in all (marked on the whole text: a closing tag past the cut
    still marks what comes before it private)."""
    out, left = [], cap
    for run, private in runs:
        if left <= 0:
            break
        out.append((run[:left], private))
        left -= len(run)
    return out


def _runs(message: Message, private_tag: str) -> list[tuple[str, bool]]:
    """The text as runs of (text, private): an assistant's `<think>` blocks are private, one run each."""
    if message.role != "assistant":
        return [(message.text, False)]
    runs: list[tuple[str, bool]] = []
    for run, private in marked(message.text, private_tag):  # one run per private block, its tags inside
        if runs and runs[-1][1] == private:
            runs[-1] = (runs[-1][0] + run, private)
        else:
            runs.append((run, private))
    return runs


def _run_html(run: str, private: bool) -> str:
    return f'<span class="private" title="{PRIVATE_TITLE}">{escape(run)}</span>' if private else escape(run)


def _image_html(part: ImagePart) -> str:
    """An image the run folder stores (`core.image_ref`) as an `<img>` of the viewer's `/image/NAME`; one inline
    in the row (a run written before images were stored, another format) as an `<img>` of its data URI when it is
    one of the stored formats and at most INLINE_IMAGE_CAP characters; anything else (a URL elsewhere: never
    fetched) as a placeholder."""
    url = part.image_url.get("url", "")
    name = stored_name(url)
    if name is not None:
        return f'<img class="image" src="{escape(image_url(name))}" alt="image {escape(name)}" title="images/{name}"/>'
    if len(url) <= INLINE_IMAGE_CAP and any(url.startswith(f"data:{mime};base64,") for mime in FORMATS.values()):
        return f'<img class="image" src="{escape(url)}" alt="inline image"/>'
    shown = "inline data" if url.startswith("data:") else url
    return f'<span class="image">[image: {escape(shown[:200])}]</span>'


def image_url(name: str) -> str:
    """The viewer's URL of a stored image by its file name (`<sha256>.<ext>`)."""
    return f"/image/{name}"


def _call_html(call: ToolCall, left_out: str, cap: int) -> str:
    """A tool call: its name, its id and its arguments (indented when they are JSON and still fit in `cap`
    characters indented, raw when not; arguments past `cap` characters: their raw head, then `left_out`)."""
    arguments = call.arguments[:cap]
    if not left_out:
        with contextlib.suppress(json.JSONDecodeError, RecursionError):  # deep nesting: shown raw
            indented = json.dumps(json.loads(call.arguments), indent=2, ensure_ascii=False)
            arguments = indented if len(indented) <= cap else arguments
    return (f'<div class="call"><span class="call-name">{escape(call.name)}</span> <code class="call-id">'
            f'{escape(call.id)}</code><pre class="call-args">{escape(arguments)}</pre>{left_out}</div>')
