"""Message view: one chat message as escaped HTML (its role, its text with private reasoning marked, its tool
calls with their arguments, a tool result's call), the one piece every page that shows a conversation uses.

Every string from a trace goes through `html.escape`, so message text such as `<script>` is shown, never run.
"""

from __future__ import annotations

import json
from html import escape

from tracegym.core.graph import Node
from tracegym.core.messages import ImagePart, Message, ToolCall
from tracegym.envs.view import PRIVATE_TAG, marked

PRIVATE_TITLE = "private reasoning: never shown to the other members"


def message_html(message: Message, node: Node | None = None, *, private_tag: str = PRIVATE_TAG) -> str:
    """`message` as a `<div class="msg role-ROLE">`: a head (role, name, the call a tool result answers, and for a
    graph `node`: its id, whether the model sampled it, its policy version, its token count, a parse-error
    flag) and the body. An assistant's `<think>` blocks (`private_tag`) and its `reasoning_content` are wrapped
    in `<span class="private">`; text keeps its line breaks (CSS `white-space: pre-wrap`)."""
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
        body.append(f'<div class="private" title="{PRIVATE_TITLE}">{escape(message.reasoning_content)}</div>')
    text = _text_html(message, private_tag)
    if text:
        body.append(f'<div class="msg-text">{text}</div>')
    body += [_call_html(call) for call in message.tool_calls]
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
        flat = " ".join(run.split())
        if left <= 0 or not flat:
            continue
        flat = flat if len(flat) <= left else flat[: left - 1] + "…"
        left -= len(flat) + 1
        out.append(_run_html(flat, private))
    return " ".join(out)


def _text_html(message: Message, private_tag: str) -> str:
    """The content, private runs marked on an assistant's text; images as a placeholder (never fetched)."""
    if isinstance(message.content, list):
        parts = [escape(p.text) if not isinstance(p, ImagePart) else _image_html(p) for p in message.content]
        return "".join(parts)
    return "".join(_run_html(run, private) for run, private in _runs(message, private_tag))


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
    url = part.image_url.get("url", "")
    shown = "inline data" if url.startswith("data:") else url
    return f'<span class="image">[image: {escape(shown[:200])}]</span>'


def _call_html(call: ToolCall) -> str:
    """A tool call: its name, its id and its arguments (indented when they are JSON, raw when not)."""
    try:
        arguments = json.dumps(json.loads(call.arguments), indent=2, ensure_ascii=False)
    except json.JSONDecodeError:
        arguments = call.arguments
    return (f'<div class="call"><span class="call-name">{escape(call.name)}</span> <code class="call-id">'
            f'{escape(call.id)}</code><pre class="call-args">{escape(arguments)}</pre></div>')
