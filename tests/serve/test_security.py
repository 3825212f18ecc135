"""Shared secret: required off loopback; requests without it are rejected."""

import pytest
from serve_helpers import running_server

from tracegym import UsageError
from tracegym.serve import EnvClient, EnvServer, RemoteError
from tracegym.serve.wire import SECRET_ENV
from tracegym.testing.echo import SPEC


def test_binding_off_loopback_without_a_secret_is_refused(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(UsageError, match=SECRET_ENV):
        EnvServer(SPEC, address="tcp://0.0.0.0:0")


@pytest.fixture(scope="module")
def guarded():
    with running_server(secret="s3cret") as server:
        yield server


async def test_a_request_without_the_secret_is_rejected(guarded, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    async with EnvClient(guarded.bound) as client:
        with pytest.raises(RemoteError) as caught:
            await client.health()
    assert caught.value.type == "Unauthenticated"


async def test_a_request_with_a_wrong_secret_is_rejected(guarded):
    async with EnvClient(guarded.bound, secret="guess") as client:
        with pytest.raises(RemoteError, match="Unauthenticated"):
            await client.info()


async def test_a_request_with_the_secret_from_the_environment_is_served(guarded, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "s3cret")
    async with EnvClient(guarded.bound) as client:
        assert (await client.health())["ok"]
