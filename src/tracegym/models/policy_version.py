"""Policy version: how a vLLM server tells each response which policy version served it.

During RL the trainer replaces the served weights while rollouts are in flight, so only the server knows which
weights answered a call. vLLM runs with this module's middleware (`--middleware
tracegym.models.policy_version.Stamp`, see `VLLMServerConfig.report_policy_version`); after each publish the
weight sync posts the new version to `ROUTE`, and every response carries the version current when its request
*arrived* in the `HEADER` header. A reload during a long generation means some of its tokens came from newer
weights; stamping the arrival version errs toward older, which is the safe side for dropping stale samples.

The stamp holds for the prompt too: each generation request is given vLLM's `cache_salt` of its arrival version
(`SALTED_ROUTES`), so its prompt can reuse only KV that requests of that same version cached. Weights merged into
vLLM keep the base model's name, and without the salt a request stamped with the new version would reuse prompt
KV the old weights computed: vLLM's prefix-cache reset does nothing while any request runs, which in an
overlapped run is nearly always. The transport reads the header (`read`) with each reply, the model clients put
it on `ModelResponse.policy_version`, and the rollout stamps the node.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

HEADER = "x-tracegym-policy-version"
ROUTE = "/tracegym/policy_version"
MIDDLEWARE = f"{__name__}.Stamp"
"""What `vllm serve --middleware` takes to load `Stamp`."""
SALTED_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages"})
"""vLLM's generation routes, whose JSON bodies take `cache_salt`."""
SALT_LIMIT = 128
"""vLLM's longest `cache_salt`."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_served: int | None = None
"""The version the server in this process serves now (None until the first publish: the base model)."""


class Stamp:
    """ASGI middleware: answers `POST ROUTE {"version": N}`; gives every other request the version served when it
    arrived, in its response's `HEADER` and (generation routes) as the `cache_salt` of its prompt's KV."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == ROUTE and scope["method"] == "POST":
            await _publish(await _body(receive), send)
            return
        version = _served
        if version is not None and scope["method"] == "POST" and scope["path"] in SALTED_ROUTES:
            body = _salted(await _body(receive), version)
            scope = {**scope, "headers": _with_length(scope["headers"], len(body))}
            receive = _replay(body, receive)

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start" and version is not None:
                message["headers"] = [*message.get("headers", []), (HEADER.encode(), str(version).encode())]
            await send(message)

        await self.app(scope, receive, stamped)


async def _publish(body: bytes, send: Send) -> None:
    """Take the version a publish posts, answering with it (or a 400 naming what was expected)."""
    global _served
    reply: dict[str, int | str]
    try:
        _served = int(json.loads(body)["version"])
        status, reply = 200, {"version": _served}
    except (ValueError, KeyError, TypeError) as exc:
        status, reply = 400, {"error": f"expected {{'version': int}}: {exc}"}
    data = json.dumps(reply).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _salted(body: bytes, version: int) -> bytes:
    """`body` with the version leading its `cache_salt` (a salt the caller set follows it); unchanged when it is
    not a JSON object, for vLLM to refuse as it would."""
    try:
        request = json.loads(body)
    except ValueError:
        return body
    if not isinstance(request, dict):
        return body
    own = request.get("cache_salt")
    salt = f"tracegym-policy-{version}" + (f".{own}" if isinstance(own, str) and own else "")
    return json.dumps({**request, "cache_salt": salt[:SALT_LIMIT]}).encode()


async def _body(receive: Receive) -> bytes:
    chunks, more = [], True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands over `body` once, then the client's own messages (vLLM aborts a request on the
    client's disconnect, so that must still come through)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    return [*((k, v) for k, v in headers if k.lower() != b"content-length"), (b"content-length", str(length).encode())]


def read(headers: Mapping[str, str]) -> int | None:
    """The policy version a response's headers report, or None when the server does not report one."""
    value = headers.get(HEADER)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
