"""Transport: the one HTTP edge of model clients, weight sync and vLLM probes, where failures become tracegym errors.

The policy is decided here once. No reply (connection refused or dropped, an attempt past its timeout), HTTP 429,
5xx, or a 2xx body that is not JSON (a proxy's error page) is `Unavailable`, an InfrastructureError worth another
try; a 400 naming the context length is a ContextLengthError (the rollout ends as truncated); any other 4xx is
`Refused`, a ModelError that another try would only repeat. Both carry the HTTP status (None: no reply).

Two faces share that policy. `Transport` is the async one the model clients hold: an aiohttp session per event
loop, each attempt under `asyncio.timeout(endpoint.timeout)`, `Unavailable` retried `endpoint.max_retries` times
with jittered exponential backoff, and the policy version the server stamped on the reply read from its headers.
`call` is the sync one (urllib) for weight sync and the vLLM probes: one attempt, since their callers either
poll or must fail loudly. `served_models` is the one place an endpoint's `/models` list is asked for.

A streamed request (`post(..., reader=...)`, the body asking `stream: true`) is read as server-sent events, each
`data:` chunk handed to the `ChunkReader` as it arrives, under the same policy and the same per-attempt timeout
(the whole reply's); an endpoint that answers with the whole reply instead is read as unstreamed. A failure
before the reader showed anything of the reply is retried as any other, the reader restarted; after, it is a
`StreamCut`, never retried: what was shown cannot be taken back, and a retry would sample another reply. An
`error` event in the stream is the failure its code names, as an HTTP error status is.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import re
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from tracegym.core.errors import ContextLengthError, InfrastructureError, ModelError, TracegymError
from tracegym.models import policy_version
from tracegym.models.endpoint import Endpoint

_CONTEXT_LENGTH = re.compile(
    r"maximum context length|max_model_len|longer than the maximum model length|context length exceeded|"
    r"context_length_exceeded|too many tokens",
    re.IGNORECASE,
)
PROBE_TIMEOUT_S = 10.0
"""How long `served_models` waits for an endpoint's list by default."""


class Unavailable(InfrastructureError):
    """No usable answer (no reply, a timeout, HTTP 429 or 5xx, a body that is not JSON): worth another try."""

    def __init__(self, url: str, status: int | None, what: str) -> None:
        super().__init__(f"{url} {what}")
        self.url, self.status, self.what = url, status, what

    def after(self, attempts: int) -> Unavailable:
        """This failure, saying it was the last of `attempts`."""
        return Unavailable(self.url, self.status, f"{self.what} (after {attempts} attempts)")

    def __reduce__(self) -> tuple[type, tuple[str, int | None, str]]:
        return Unavailable, (self.url, self.status, self.what)  # picklable, as exceptions crossing processes are


class StreamCut(InfrastructureError):
    """A streamed reply failed after part of it was shown to the caller's caller: not retried (see the module)."""

    def __init__(self, url: str, what: str) -> None:
        super().__init__(f"{url} {what}, after part of the streamed reply was shown (not retried: it cannot be "
                         f"taken back)")
        self.url, self.what = url, what

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return StreamCut, (self.url, self.what)


class Refused(ModelError):
    """The server answered a 4xx other than a context overflow: the request itself is at fault."""

    def __init__(self, url: str, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status} from {url}: {detail}")
        self.url, self.status, self.detail = url, status, detail

    def __reduce__(self) -> tuple[type, tuple[str, int, str]]:
        return Refused, (self.url, self.status, self.detail)


def failure(url: str, status: int, body: str) -> TracegymError:
    """The error for a reply with a status other than 2xx (the policy, decided here once)."""
    detail = error_message(body)
    if status == 429 or status >= 500:
        return Unavailable(url, status, f"answered HTTP {status}: {detail}")
    if status == 400 and _CONTEXT_LENGTH.search(detail):
        return ContextLengthError(detail)
    return Refused(url, status, detail)


def no_reply(url: str, exc: BaseException) -> Unavailable:
    """The error for a request that got no answer (the library's own exception named in it)."""
    reason = getattr(exc, "reason", None) or exc  # urllib wraps the socket's error in `reason`
    named = reason if isinstance(reason, str) else f"{type(reason).__name__}: {reason}".rstrip(": ")
    return Unavailable(url, None, f"is unreachable: {named}")


def error_message(body: str) -> str:
    """The message of an OpenAI- or vLLM-shaped error body (`{"error": {"message": ...}}`, `{"message": ...}`,
    `{"error": "..."}`), else the body itself, shortened."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return body[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return body[:500]


def json_object(url: str, body: str) -> dict[str, Any]:
    """A 2xx body as a JSON object; one that is not JSON is `Unavailable` (a proxy's hiccup), one that is JSON
    but not an object a ModelError."""
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        raise Unavailable(url, None, f"answered with a body that is not JSON: {body[:200]!r}") from None
    if not isinstance(value, dict):
        raise ModelError(f"{url} answered with JSON that is not an object: {body[:200]!r}")
    return value


def backoff_delay(first: float, attempt: int) -> float:
    """How long to wait before retry `attempt + 1`: `first` doubled per attempt, jittered by 0.5x-1.5x."""
    return first * 2**attempt * random.uniform(0.5, 1.5)


class ChunkReader(Protocol):
    """What reads a streamed reply: its chunks, attempt by attempt, folded into the body the same request gets
    unstreamed (the models' `streaming.StreamedReply`)."""

    @property
    def shown(self) -> bool:
        """Whether any of the reply reached the caller's caller: a failure after that is a `StreamCut`."""
        ...

    def restart(self) -> None:
        """A new attempt begins: forget the chunks of the last."""
        ...

    def read(self, chunk: dict[str, Any]) -> None:
        """One `data:` event's JSON object, as it arrives."""
        ...

    async def arrived(self) -> None:
        """The chunks that arrived together have been read (one show per network read, not one per chunk)."""
        ...

    def body(self) -> dict[str, Any]:
        """The chunks read, folded into the body the request gets unstreamed."""
        ...


@dataclass(frozen=True)
class Reply:
    """A 2xx JSON reply and the policy version the server stamped on it (None when it does not report one)."""

    data: dict[str, Any]
    policy_version: int | None = None


class Transport:
    """The async face: JSON POSTs to one endpoint, retried by the policy above; close with `aclose()`."""

    def __init__(self, endpoint: Endpoint, *, sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        """`sleep` waits out each retry's backoff (tests pass one that records the delays)."""
        self.endpoint = endpoint
        self.base_url = endpoint.base_url.rstrip("/")
        self._sleep = sleep
        self._headers = {"Content-Type": "application/json"}
        if key := endpoint.api_key():
            self._headers["Authorization"] = f"Bearer {key}"
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    def _session(self) -> aiohttp.ClientSession:
        """This event loop's session (a session cannot cross loops; each test or thread gets its own)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            connector = aiohttp.TCPConnector(limit=self.endpoint.max_connections, ttl_dns_cache=300)
            # No aiohttp timeout: each attempt runs under `asyncio.timeout` instead. aiohttp's own timer, firing
            # with a caller's deadline (a rollout's model stage), reports the caller's cancellation as its own
            # TimeoutError, which was retried: the call outlived the deadline and ended as an infrastructure error.
            session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(),
                                            headers=self._headers)
            self._sessions = {lp: s for lp, s in self._sessions.items() if not lp.is_closed()}
            self._sessions[loop] = session
        return session

    async def aclose(self) -> None:
        """Close this loop's session."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    async def post(self, route: str, body: dict[str, Any], reader: ChunkReader | None = None) -> Reply:
        """POST `body` to `base_url + route` until an attempt succeeds or the retries run out; with `reader`, the
        reply is streamed through it (see the module). Only `Unavailable` is retried: a cancellation (a caller's
        deadline) ends the call at once, in flight or in backoff."""
        url = self.base_url + route
        attempts = self.endpoint.max_retries + 1
        for attempt in range(attempts):
            try:
                return await self._attempt(url, body, reader)
            except Unavailable as exc:
                if reader is not None and reader.shown:
                    raise StreamCut(url, exc.what) from None
                if attempt == attempts - 1:
                    raise exc.after(attempts) from None
                await self._sleep(backoff_delay(self.endpoint.backoff, attempt))
        raise AssertionError("unreachable")

    async def _attempt(self, url: str, body: dict[str, Any], reader: ChunkReader | None) -> Reply:
        """One POST under the endpoint's per-attempt timeout; aiohttp's exceptions become the policy's errors."""
        try:
            async with asyncio.timeout(self.endpoint.timeout), self._session().post(url, json=body) as http:
                status, version = http.status, policy_version.read(http.headers)
                if reader is not None and 200 <= status < 300 and http.content_type == "text/event-stream":
                    reader.restart()
                    await _read_events(url, http.content, reader)
                    return Reply(reader.body(), version)
                text = await http.text()
        except TimeoutError:
            raise Unavailable(url, None, f"gave no reply within {self.endpoint.timeout:g} s (TimeoutError)") from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise no_reply(url, exc) from None
        if not 200 <= status < 300:
            raise failure(url, status, text)
        return Reply(json_object(url, text), version)


async def _read_events(url: str, content: aiohttp.StreamReader, reader: ChunkReader) -> None:
    """Hand each `data:` event of a server-sent stream to `reader` until `[DONE]`; an `error` event raises the
    failure its code names (a stream that ends without `[DONE]` was cut: `Unavailable`)."""
    pending = b""
    async for piece in content.iter_any():
        pending += piece
        *events, pending = pending.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            data = b"\n".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
            if data == b"[DONE]":
                await reader.arrived()
                return
            if data:
                chunk = json_object(url, data.decode("utf-8", errors="replace"))
                if "error" in chunk or chunk.get("object") == "error":
                    raise _stream_error(url, chunk)
                reader.read(chunk)
        await reader.arrived()
    raise Unavailable(url, None, "ended its stream before [DONE]")


def _stream_error(url: str, chunk: dict[str, Any]) -> TracegymError:
    """The failure an `error` event names: its code as the HTTP status it stands for (else a server error)."""
    error = chunk.get("error", chunk)
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    return failure(url, status, json.dumps(chunk))


def call(url: str, body: dict[str, Any] | None = None, *, timeout: float, api_key: str | None = None) -> str:
    """The sync face: one request (POST `body` as JSON, else GET) and the text of its 2xx reply; anything else
    raises the policy's error. Not retried: probes are polled by their callers, and weight sync must fail loudly."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        raise failure(url, exc.code, exc.read().decode("utf-8", errors="replace")) from None
    except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError, timeouts, resets; a malformed URL
        raise no_reply(url, exc) from None


def served_models(base_url: str, api_key: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> list[dict[str, Any]]:
    """The entries an OpenAI-compatible endpoint lists at `/models` (vLLM adds each one's `max_model_len`).
    An endpoint that cannot list them (no reply, any HTTP error such as a refused key) is `Unavailable`."""
    url = base_url.rstrip("/") + "/models"
    try:
        listed = json_object(url, call(url, timeout=timeout, api_key=api_key)).get("data", [])
    except ModelError as exc:  # Refused, or JSON of another shape: a command cannot use the endpoint as given
        raise Unavailable(url, getattr(exc, "status", None), f"is unreachable: {exc}") from None
    return [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []
