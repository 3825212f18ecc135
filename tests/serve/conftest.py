"""Fixtures for env-server tests: a fake OpenAI endpoint and a shared one-worker echo server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve_helpers import reply_with_word, running_server

from tracegym import Endpoint
from tracegym.serve import EnvServer
from tracegym.testing import FakeOpenAIServer


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(rule=reply_with_word) as server:
        yield server


@pytest.fixture(scope="module")
def endpoint(fake: FakeOpenAIServer) -> Endpoint:
    return Endpoint(base_url=fake.base_url, model="fake-model", api_key_env=None, max_retries=0)


@pytest.fixture(scope="module")
def server() -> Iterator[EnvServer]:
    """A shared one-worker echo server with `Echo()`'s options (tasks sleep 0 s in setup unless the test's own server
    says otherwise)."""
    with running_server() as srv:
        yield srv
