"""Wire: the env server's frame codec: msgpack data only (never pickle), request and reply headers, errors.

A request is two frames, `[header, payload]`: the header is a msgpack map `{"id": str, "method": str}` and the
payload is msgpack bytes the server routes unread. A reply is `[header, payload]` with header `{"id", "ok",
"error"}`; `error` is `{"type", "kind", "message"}`. A shared secret guards the socket, not the frames (see
`serve.curve`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgpack
from pydantic import AfterValidator, BeforeValidator, Field

from tracegym.core.errors import ErrorKind, FailureKind, TracegymError

PROTOCOL = 1
METHODS = ("health", "info", "rows", "run", "cancel")
MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Default limit on a request's total size; a larger one is answered with a `TooLarge` error. A big legitimate
request is a task row with a long document (a 250k-token text is about 1 MB) or a few images as data URLs (a
2-megapixel PNG is 2-4 MB, a third more in base64): 64 MiB is room for a dozen of those."""
MAX_CONTROL_BYTES = 2 * 1024 * 1024
"""Limit on the payload of a request other than `run` (`health`, `info`, `rows`, `cancel`), which the server reads
itself: the largest, a liveness ping listing `MAX_PENDING_CHECK` request ids, is at most 1.3 MB."""
MAX_PENDING_CHECK = 10_000
"""Most request ids one health ping may ask about."""
OVER_BUDGET = "OverBudget"
"""The error type of a `run` request refused because the server already holds its budget of requests received
and not yet answered (`serve.env_server`)."""
ZERO_COPY_BYTES = 64 * 1024
"""Frames at least this long are sent without a copy (libzmq sends from the sender's own bytes) and handed over as
views of the received frame."""
MAX_ID_CHARS = 128
SECRET_ENV = "TRACEGYM_ENV_SECRET"
"""Environment variable holding the shared secret (required to bind anywhere but loopback; see `serve.curve`)."""


class WireError(Exception):
    """A frame that cannot be read; `request_id` is set when the header was readable enough to answer."""

    def __init__(self, message: str, request_id: str | None = None, error_type: str = "BadRequest") -> None:
        super().__init__(message)
        self.request_id, self.error_type = request_id, error_type


class RemoteError(TracegymError):
    """An error reply from the env server: `type` names it (`WorkerDied`, `Cancelled`, `BadRequest`, ...)."""

    def __init__(self, type: str, message: str, kind: ErrorKind = ErrorKind.INFRASTRUCTURE) -> None:
        super().__init__(f"{type}: {message}")
        self.type, self.kind = type, kind
        self.failure = REMOTE_FAILURES.get(type, FailureKind.ENV_SERVER_ERROR)


REMOTE_FAILURES = {"WorkerDied": FailureKind.WORKER_DIED, "Cancelled": FailureKind.CANCELLED}
"""The failure kind of a rollout whose env-server request got an error reply of this type (any other type: the
request failed, `env_server_error`)."""


@dataclass(frozen=True)
class Request:
    """A decoded request header and its unread payload."""

    id: str
    method: str
    payload: bytes | memoryview
    """Unread; a large one is a view of the frame as ZMQ received it (not copied)."""


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack extension type {code} is not accepted")


def pack(value: Any) -> bytes:
    """Plain data as msgpack."""
    return msgpack.packb(value, use_bin_type=True)


def unpack(data: bytes | memoryview) -> Any:
    """msgpack bytes as plain data; extension types (the only way to smuggle objects) are refused."""
    return msgpack.unpackb(data, raw=False, ext_hook=_no_ext, strict_map_key=False)


def encode_request(request_id: str, method: str, payload: Any = None) -> list[bytes]:
    """The frames of one request."""
    return [pack({"id": request_id, "method": method}), pack(payload if payload is not None else {})]


def decode_request(frames: Sequence[bytes | memoryview], *, max_bytes: int = MAX_FRAME_BYTES) -> Request:
    """Read and check one request; raises WireError saying what is wrong."""
    if len(frames) != 2:
        raise WireError(f"a request is 2 frames, got {len(frames)}")
    header = _header(frames[0])
    request_id = header.get("id")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_ID_CHARS:
        raise WireError("request id must be a non-empty string of at most 128 characters")
    if sum(len(f) for f in frames) > max_bytes:
        raise WireError(f"request is over the server's {max_bytes}-byte limit", request_id, "TooLarge")
    method = header.get("method")
    if method not in METHODS:
        raise WireError(f"unknown method {method!r} (methods: {', '.join(METHODS)})", request_id)
    if method != "run" and len(frames[1]) > MAX_CONTROL_BYTES:
        raise WireError(f"a {method} request's payload is over the {MAX_CONTROL_BYTES}-byte limit", request_id,
                        "TooLarge")
    return Request(request_id, method, frames[1])


def _header(frame: bytes | memoryview) -> dict[str, Any]:
    if len(frame) > 4096:
        raise WireError("request header is over 4096 bytes")
    try:
        header = unpack(frame)
    except Exception as exc:  # msgpack raises many types: this edge makes them one WireError
        raise WireError(f"header is not msgpack ({type(exc).__name__})") from None
    if not isinstance(header, dict):
        raise WireError("header is not a msgpack map")
    return header


def ok_reply(request_id: str | None, result: Any) -> list[bytes]:
    """The frames of a successful reply."""
    return [pack({"id": request_id, "ok": True}), pack(result)]


def ok_header(request_id: str | None) -> bytes:
    """The header frame of a successful reply (the payload is packed by whoever has the result)."""
    return pack({"id": request_id, "ok": True})


def error_reply(request_id: str | None, type: str, message: str,
                kind: ErrorKind = ErrorKind.INFRASTRUCTURE) -> list[bytes]:
    """The frames of an error reply."""
    error = {"type": type, "kind": kind.value, "message": message}
    return [pack({"id": request_id, "ok": False, "error": error}), b"\xc0"]


def decode_reply(frames: list[bytes]) -> tuple[str | None, Any]:
    """(request id, result) of a reply, where result is a RemoteError for an error reply."""
    if len(frames) != 2:
        raise WireError(f"a reply is 2 frames, got {len(frames)}")
    header = unpack(frames[0])
    if header.get("ok"):
        return header.get("id"), unpack(frames[1])
    error = header.get("error") or {}
    try:
        kind = ErrorKind(error.get("kind", ""))
    except ValueError:
        kind = ErrorKind.INFRASTRUCTURE
    return header.get("id"), RemoteError(str(error.get("type")), str(error.get("message")), kind)


def zmq_address(value: str) -> str:
    """`value` when it is a ZMQ address (`tcp://host:port`, `ipc://path`); else a ValueError saying so."""
    transport, sep, rest = value.partition("://")
    if not sep or transport not in ("tcp", "ipc", "inproc") or not rest or (transport == "tcp" and ":" not in rest):
        raise ValueError("not an env server address; give one like tcp://127.0.0.1:5555")
    return value


Address = Annotated[str, AfterValidator(zmq_address)]
"""An env server's address, checked when a config is made."""


def listed(value: Any) -> Any:
    """One address given alone (a TOML string, one flag value) is a list of one."""
    return [value] if isinstance(value, str) else value


Addresses = Annotated[list[Address], BeforeValidator(listed), Field(min_length=1)]
"""The addresses of one or more env servers of the same taskset (on several hosts, say): rollouts are spread over
them and a lost one's go to the others."""


def is_loopback(address: str) -> bool:
    """True for ipc/inproc addresses and TCP on 127.0.0.0/8, ::1 or localhost."""
    transport, _, rest = address.partition("://")
    if transport in ("ipc", "inproc"):
        return True
    host = rest.rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"
