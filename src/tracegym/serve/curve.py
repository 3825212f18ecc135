"""Curve: what a shared secret does to the env server's client-facing sockets: CURVE encryption, and admission of
only the peers that hold the secret, decided in the handshake, before a peer can send a byte of payload.

Both sides derive two CURVE key pairs from the secret (the server's and the clients'), by scrypt with a fixed salt,
once per process; the secret itself never crosses the wire, and a captured public key costs a guesser one scrypt
per guess. A client must know the server's public key to be understood at all, and the server's ZAP check
admits only the clients' public key, whose private half proves possession of the secret. Each connection then
gets fresh session keys and numbered messages, so captured traffic can be neither read nor replayed.
"""

from __future__ import annotations

import functools
import hashlib
import os

import zmq
from zmq.utils import z85

from tracegym.core.errors import ErrorKind, UsageError
from tracegym.serve.wire import SECRET_ENV

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
"""Where libzmq asks a context's ZAP handler whether to admit a peer (fixed by the ZAP spec)."""
SALT = b"tracegym-env-curve-v1"
"""scrypt's salt for the keys (fixed: server and clients must derive the same keys from the same secret)."""
SCRYPT = {"n": 2**14, "r": 8, "p": 1}
"""scrypt's cost: about 16 MiB and a few tens of milliseconds, paid once per process."""
MIN_SECRET_CHARS = 16
HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
"""Socket monitor events of a connection refused during its handshake."""


class AuthenticationError(UsageError):
    """A peer refused this client's handshake: an env server with another shared secret (or none, or one where
    the client has none), or something that is not an env server (a setting to fix, not a fault of the task)."""

    kind = ErrorKind.INFRASTRUCTURE


def shared_secret(given: str | None) -> str | None:
    """The shared secret in force: `given`, else $TRACEGYM_ENV_SECRET, else None; a UsageError when too short."""
    secret = given if given is not None else os.environ.get(SECRET_ENV) or None
    if secret is not None and len(secret) < MIN_SECRET_CHARS:
        raise UsageError(f"the shared secret ({SECRET_ENV}, or `secret=`) must be at least {MIN_SECRET_CHARS} "
                         f"characters, got {len(secret)}: use a long random string")
    return secret


@functools.cache
def key_pairs(secret: str) -> tuple[tuple[bytes, bytes], tuple[bytes, bytes]]:
    """The server's and the clients' (public, private) CURVE keys, z85-encoded, under `secret`: scrypt(secret,
    SALT) gives 64 bytes, the server's private key then the clients'."""
    derived = hashlib.scrypt(secret.encode(), salt=SALT, dklen=64, **SCRYPT)
    server, client = z85.encode(derived[:32]), z85.encode(derived[32:])
    return (zmq.curve_public(server), server), (zmq.curve_public(client), client)


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise UsageError("a shared secret needs CURVE, which this pyzmq's libzmq lacks; install pyzmq's own wheels")


def guard_server(socket: zmq.Socket, secret: str) -> None:
    """Make `socket` (before it binds) a CURVE server under `secret`; its context needs a `Gatekeeper`."""
    _require_curve()
    socket.curve_server = True
    socket.curve_secretkey = key_pairs(secret)[0][1]
    socket.zap_domain = b"tracegym"


def guard_client(socket: zmq.Socket, secret: str) -> None:
    """Make `socket` (before it connects) a CURVE client under `secret`."""
    _require_curve()
    server, client = key_pairs(secret)
    socket.curve_serverkey = server[0]
    socket.curve_publickey, socket.curve_secretkey = client


class Gatekeeper:
    """The ZAP handler of a server's context: admits a CURVE peer only with the clients' key under the secret.
    Answered from the server's own poll loop (`answer` when its socket is readable): no thread."""

    def __init__(self, ctx: zmq.Context, secret: str) -> None:
        self.client_key = z85.decode(key_pairs(secret)[1][0])
        self.socket = ctx.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(ZAP_ENDPOINT)

    def answer(self) -> None:
        """Answer every waiting ZAP request (version, request id, domain, address, identity, mechanism, key)."""
        while True:
            try:
                version, request_id, _domain, _address, _identity, mechanism, *credentials = (
                    self.socket.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            admitted = mechanism == b"CURVE" and credentials[:1] == [self.client_key]
            status = [b"200", b"OK"] if admitted else [b"400", b"not the shared secret's key"]
            self.socket.send_multipart([version, request_id, *status, b"", b""])

    def close(self) -> None:
        self.socket.close(0)


def refusal(address: str, has_secret: bool) -> AuthenticationError:
    """What refused handshakes mean for the user of a client with (or without) a shared secret. Which side lacked
    what cannot be told reliably (the side that notices a mismatch first hangs up on the other), nor whether the
    peer is an env server at all (a wrong port fails the handshake too)."""
    if has_secret:
        why = (f"its shared secret differs from this client's ({SECRET_ENV}): set it to the one the server was "
               "started with, or unset it if the server has none")
    else:
        why = f"it requires a shared secret: set {SECRET_ENV} to the one it was started with"
    return AuthenticationError(f"handshake refused by {address}: not a tracegym env server, or {why}")
