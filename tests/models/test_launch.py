"""Model choice -> endpoint: an existing URL is checked before use; names and failures are clear."""

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import tracegym as tg
from tracegym.models.embedded import SERVED_MODEL_NAME
from tracegym.models.launch import only_served_model, serve, server_config
from tracegym.models.model_choice import ModelChoice
from tracegym.testing import FakeOpenAIServer


def test_an_existing_endpoint_is_used_with_its_only_model():
    with FakeOpenAIServer(["hi"], model="served-one") as fake, serve(ModelChoice(base_url=fake.base_url)) as endpoint:
        assert (endpoint.base_url, endpoint.model) == (fake.base_url, "served-one")


def test_the_tokens_client_settings_reach_the_endpoint():
    choice = ModelChoice(client="tokens", tokenizer="/tok", renderer="qwen3")
    with FakeOpenAIServer(["hi"], model="m") as fake, serve(choice.model_copy(update={"base_url": fake.base_url})) as e:
        assert (e.client, e.tokenizer, e.renderer) == ("tokens", "/tok", "qwen3")


def test_a_model_the_endpoint_does_not_serve_is_a_usage_error():
    with FakeOpenAIServer(["hi"], model="served-one") as fake:
        choice = ModelChoice(base_url=fake.base_url, name="other")
        with pytest.raises(tg.UsageError, match=r"does not serve model 'other'.*served-one"), serve(choice):
            pass


def test_an_unreachable_endpoint_fails_fast_naming_the_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    with pytest.raises(tg.InfrastructureError, match=f"{url}/models is unreachable"), serve(ModelChoice(base_url=url)):
        pass


def test_a_model_directory_is_served_under_its_last_path_part(tmp_path):
    model_dir = tmp_path / "my-model"
    model_dir.mkdir()
    config = server_config(ModelChoice(name=str(model_dir)))
    assert config.model == str(model_dir) and config.name == "my-model"


def test_no_model_means_the_embedded_one():
    assert ModelChoice().display_name() == SERVED_MODEL_NAME


class _KeyedModels(http.server.BaseHTTPRequestHandler):
    """`/v1/models` listing one model, only for requests bearing the key `sekret`."""

    def do_GET(self) -> None:
        ok = self.headers.get("Authorization") == "Bearer sekret"
        body = json.dumps({"data": [{"id": "keyed-model"}]} if ok else {"error": "no key"}).encode()
        self.send_response(200 if ok else 401)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def keyed_endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeyedModels)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def test_the_api_key_is_sent_when_asking_an_endpoint_for_its_only_model(monkeypatch):
    monkeypatch.setenv("TINY_KEY", "sekret")
    with keyed_endpoint() as url, serve(ModelChoice(base_url=url, api_key_env="TINY_KEY")) as endpoint:
        assert endpoint.model == "keyed-model"
        assert only_served_model(url, "TINY_KEY") == "keyed-model"


def test_an_endpoint_refusing_a_missing_key_is_reported_unreachable(monkeypatch):
    monkeypatch.delenv("TINY_KEY", raising=False)
    with keyed_endpoint() as url, pytest.raises(tg.InfrastructureError, match="unreachable"):
        only_served_model(url, "TINY_KEY")
