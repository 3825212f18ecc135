"""The wire codec: request and reply frames, limits, refusing anything but plain data."""

import msgpack
import pytest

from tracegym import ErrorKind
from tracegym.serve.wire import (
    RemoteError,
    WireError,
    decode_reply,
    decode_request,
    encode_request,
    error_reply,
    is_loopback,
    ok_reply,
    unpack,
)


def test_request_round_trips():
    request = decode_request(encode_request("r1", "run", {"data": {"prompt": "hi"}}))
    assert (request.id, request.method, unpack(request.payload)) == ("r1", "run", {"data": {"prompt": "hi"}})


def test_garbage_header_is_a_wire_error():
    with pytest.raises(WireError):
        decode_request([b"\xc1\xc1 not msgpack", b""])


def test_wrong_frame_count_is_a_wire_error():
    with pytest.raises(WireError, match="2 frames"):
        decode_request([b"x"])


def test_unknown_method_is_answerable_with_its_id():
    with pytest.raises(WireError) as caught:
        decode_request(encode_request("r2", "explode"))
    assert caught.value.request_id == "r2"


def test_oversized_request_is_refused():
    with pytest.raises(WireError, match="limit"):
        decode_request(encode_request("r3", "run", {"blob": "x" * 2000}), max_bytes=1000)


def test_extension_types_are_refused():
    with pytest.raises(ValueError, match="extension"):
        unpack(msgpack.packb(msgpack.ExtType(1, b"code")))


def test_ok_reply_decodes_to_its_result():
    assert decode_reply(ok_reply("r7", {"a": 1})) == ("r7", {"a": 1})


def test_error_reply_decodes_to_a_remote_error():
    request_id, error = decode_reply(error_reply("r8", "WorkerDied", "gone", ErrorKind.INFRASTRUCTURE))
    assert request_id == "r8" and isinstance(error, RemoteError)
    assert (error.type, error.kind) == ("WorkerDied", ErrorKind.INFRASTRUCTURE)


@pytest.mark.parametrize(("address", "loopback"), [
    ("tcp://127.0.0.1:5555", True), ("tcp://localhost:0", True), ("tcp://[::1]:9", True), ("ipc:///tmp/x", True),
    ("tcp://0.0.0.0:5555", False), ("tcp://*:5555", False), ("tcp://10.1.2.3:5555", False),
])
def test_loopback_addresses_are_recognised(address, loopback):
    assert is_loopback(address) is loopback
