"""Transport: the one failure policy (status -> tracegym error, what is retried) through both faces, the policy
version read from the reply's headers, and the one `/models` fetch."""

import http.server
import json
import pickle
import socket
import threading
from collections.abc import Iterator
from contextlib import aclosing, contextmanager

import pytest

import tracegym as tg
from tracegym.models import transport
from tracegym.models.endpoint import Endpoint
from tracegym.models.transport import Refused, Transport, Unavailable, failure, served_models
from tracegym.testing import FakeOpenAIServer

URL = "http://host/v1/x"


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_429_and_5xx_are_unavailable_and_keep_their_status(status):
    error = failure(URL, status, '{"error": {"message": "busy"}}')
    assert isinstance(error, Unavailable) and isinstance(error, tg.InfrastructureError)
    assert error.status == status and "busy" in str(error)


def test_a_400_naming_the_context_length_is_a_context_length_error():
    error = failure(URL, 400, json.dumps({"message": "This model's maximum context length is 5 tokens."}))
    assert type(error) is tg.ContextLengthError


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_other_4xx_are_refused_with_their_status_and_message(status):
    error = failure(URL, status, json.dumps({"error": "no such thing"}))
    assert isinstance(error, Refused) and isinstance(error, tg.ModelError)
    assert (error.status, error.detail) == (status, "no such thing")
    assert str(error) == f"HTTP {status} from {URL}: no such thing"


def test_an_error_body_that_is_not_json_is_quoted_shortened():
    assert failure(URL, 418, "x" * 900).detail == "x" * 500


def test_the_policys_errors_survive_pickling():
    for error in (failure(URL, 503, "busy"), failure(URL, 404, "gone")):
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy), copy.status) == (type(error), str(error), error.status)

def test_retries_back_off_from_the_first_delay_doubling_with_jitter():
    for attempt in range(5):
        assert 0.5 * 2**attempt * 0.5 <= transport.backoff_delay(0.5, attempt) <= 0.5 * 2**attempt * 1.5


# --- the async face --------------------------------------------------------------------------------------
async def test_the_reply_carries_the_policy_version_from_its_headers():
    with FakeOpenAIServer(["hi"]) as fake:
        fake.policy_version = 7
        endpoint = Endpoint(base_url=fake.base_url, model=fake.model)
        async with aclosing(Transport(endpoint)) as http:
            reply = await http.post("/chat/completions", {"model": fake.model, "messages": []})
    assert reply.policy_version == 7 and reply.data["choices"][0]["message"]["content"] == "hi"


async def test_no_policy_version_without_the_header():
    with FakeOpenAIServer(["hi"]) as fake:
        async with aclosing(Transport(Endpoint(base_url=fake.base_url, model=fake.model))) as http:
            reply = await http.post("/chat/completions", {"model": fake.model, "messages": []})
    assert reply.policy_version is None


async def test_only_unavailable_is_retried_and_the_last_failure_says_how_many_attempts():
    with FakeOpenAIServer(["hi"], fail_first=10, fail_status=503) as fake:
        endpoint = Endpoint(base_url=fake.base_url, model=fake.model, max_retries=1, backoff=0)
        async with aclosing(Transport(endpoint)) as http:
            with pytest.raises(Unavailable, match=r"HTTP 503.*\(after 2 attempts\)") as caught:
                await http.post("/chat/completions", {"model": fake.model, "messages": []})
    assert caught.value.status == 503 and len(fake.requests) == 2


async def test_a_refusal_is_not_retried():
    with FakeOpenAIServer(["hi"]) as fake:
        endpoint = Endpoint(base_url=fake.base_url, model=fake.model, max_retries=3, backoff=0)
        async with aclosing(Transport(endpoint)) as http:
            with pytest.raises(Refused) as caught:
                await http.post("/chat/completions", {"model": "not-served", "messages": []})
    assert caught.value.status == 404 and len(fake.requests) == 1


# --- the sync face ---------------------------------------------------------------------------------------
def test_the_sync_face_gets_and_posts_and_maps_statuses_by_the_same_policy():
    with answering({"/ok": (200, "fine"), "/gone": (404, '{"message": "no route"}'), "/down": (503, "")}) as root:
        assert transport.call(f"{root}/ok", timeout=5) == "fine"
        assert transport.call(f"{root}/ok", {"a": 1}, timeout=5) == "fine"
        with pytest.raises(Refused, match="no route"):
            transport.call(f"{root}/gone", timeout=5)
        with pytest.raises(Unavailable) as caught:
            transport.call(f"{root}/down", timeout=5)
    assert caught.value.status == 503


def test_no_reply_is_unavailable_without_a_status():
    url = f"{closed_port_url()}/health"
    with pytest.raises(Unavailable, match=f"{url} is unreachable") as caught:
        transport.call(url, timeout=2)
    assert caught.value.status is None


def test_served_models_lists_the_endpoints_models():
    with FakeOpenAIServer(["hi"], model="m1") as fake:
        assert [m["id"] for m in served_models(fake.base_url)] == ["m1"]


def test_an_endpoint_that_refuses_to_list_its_models_is_unreachable():
    refusing = answering({"/v1/models": (401, '{"error": "no key"}')})
    with refusing as root, pytest.raises(Unavailable, match=r"/v1/models is unreachable: HTTP 401 .*no key"):
        served_models(f"{root}/v1")


# --- helpers ---------------------------------------------------------------------------------------------
@contextmanager
def answering(routes: dict[str, tuple[int, str]]) -> Iterator[str]:
    """A loopback HTTP server answering each path in `routes` (GET or POST) with its (status, body)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            status, body = routes.get(self.path, (404, "unknown"))
            self.send_response(status)
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = _answer

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"

