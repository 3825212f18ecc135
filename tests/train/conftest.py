"""Fixtures shared by the training tests."""

import pytest

from tracegym.serve.local_server import local_server
from tracegym.train.rl_folder import Endpoints


@pytest.fixture(scope="module")
def endpoints():
    """The run's env servers (asked what they serve and read from; no rollout runs), and a vLLM never called."""
    with local_server("reverse-text", workers=1) as reverse, local_server("alphabet-sort", workers=1) as sort:
        yield Endpoints(base_url="http://127.0.0.1:9/v1", base_model="base",
                        envs={"reverse-text": reverse, "alphabet-sort": sort})
