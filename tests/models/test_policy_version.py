"""Policy version: vLLM's middleware stamps each response with the version that served it; clients read it."""

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient

from tracegym.core.messages import user
from tracegym.models import policy_version
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest
from tracegym.models.endpoint import Endpoint
from tracegym.models.vllm_server import VLLMServerConfig, server_command
from tracegym.testing import FakeOpenAIServer

HELLO = ModelRequest(messages=[user("hello")])


@pytest.fixture
def app(monkeypatch):
    monkeypatch.setattr(policy_version, "_served", None)

    api = FastAPI()  # as vLLM's API server loads `--middleware` classes

    @api.post("/v1/completions")
    async def generate(request: Request) -> PlainTextResponse:  # answers with the body it was handed
        return PlainTextResponse(await request.body())

    @api.post("/v1/tokenize")
    async def tokenize(request: Request) -> PlainTextResponse:
        return PlainTextResponse(await request.body())

    api.add_middleware(policy_version.Stamp)
    return TestClient(api)


def handed(reply) -> dict:
    """The JSON body the route was handed."""
    return json.loads(reply.text)


def test_a_server_reports_no_version_before_the_first_publish(app):
    assert policy_version.HEADER not in app.post("/v1/completions").headers


def test_every_response_after_a_publish_carries_the_published_version(app):
    assert app.post(policy_version.ROUTE, json={"version": 3}).json() == {"version": 3}
    assert app.post("/v1/completions").headers[policy_version.HEADER] == "3"
    app.post(policy_version.ROUTE, json={"version": 4})
    assert app.post("/v1/completions").headers[policy_version.HEADER] == "4"


def test_a_malformed_publish_is_refused_and_changes_nothing(app):
    app.post(policy_version.ROUTE, json={"version": 2})
    assert app.post(policy_version.ROUTE, json={"v": 3}).status_code == 400
    assert app.post("/v1/completions").headers[policy_version.HEADER] == "2"


def test_a_generation_request_is_salted_with_the_version_it_arrived_at(app):
    app.post(policy_version.ROUTE, json={"version": 5})
    reply = app.post("/v1/completions", json={"prompt": "hi"})
    assert handed(reply) == {"prompt": "hi", "cache_salt": "tracegym-policy-5"}
    assert reply.headers[policy_version.HEADER] == "5"


def test_a_callers_own_salt_follows_the_version(app):
    app.post(policy_version.ROUTE, json={"version": 2})
    salted = handed(app.post("/v1/completions", json={"cache_salt": "user-a"}))
    assert salted["cache_salt"] == "tracegym-policy-2.user-a"


def test_a_salt_is_cut_to_vllms_limit(app):
    app.post(policy_version.ROUTE, json={"version": 2})
    salt = handed(app.post("/v1/completions", json={"cache_salt": "x" * 200}))["cache_salt"]
    assert len(salt) == policy_version.SALT_LIMIT and salt.startswith("tracegym-policy-2.")


def test_requests_before_the_first_publish_and_other_routes_pass_unchanged(app):
    assert handed(app.post("/v1/completions", json={"prompt": "hi"})) == {"prompt": "hi"}
    app.post(policy_version.ROUTE, json={"version": 1})
    assert handed(app.post("/v1/tokenize", json={"prompt": "hi"})) == {"prompt": "hi"}


def test_a_body_that_is_not_a_json_object_passes_unchanged_for_vllm_to_refuse(app):
    app.post(policy_version.ROUTE, json={"version": 1})
    assert app.post("/v1/completions", content=b"[1, 2").text == "[1, 2"


def test_vllm_loads_the_middleware_only_when_asked():
    assert "--middleware" not in server_command(VLLMServerConfig(model="/m"), 1)
    cmd = server_command(VLLMServerConfig(model="/m", report_policy_version=True), 1)
    assert cmd[cmd.index("--middleware") + 1] == "tracegym.models.policy_version.Stamp"


async def test_the_chat_client_reads_the_version_that_served_each_reply():
    with FakeOpenAIServer(["one", "two"]) as server:
        async with ChatClient(Endpoint(base_url=server.base_url, model=server.model)) as client:
            unversioned = await client.complete(HELLO)
            server.policy_version = 7
            versioned = await client.complete(HELLO)
    assert (unversioned.policy_version, versioned.policy_version) == (None, 7)
