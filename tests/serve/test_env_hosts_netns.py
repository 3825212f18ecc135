"""Env servers on three "hosts" (network namespaces joined by veth pairs, addresses of the test's own making, the
shared secret on): one host drops off the network mid-run, and every rollout still completes, once."""

import asyncio
import contextlib
import time

import pytest
from serve_helpers import reply_with_word

from tracegym import Endpoint
from tracegym.serve import EnvClient
from tracegym.serve.local_server import local_server
from tracegym.serve.wire import SECRET_ENV
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.echo import SPEC, Echo
from tracegym.testing.netns import NetnsHosts, available

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not available(), reason="needs root and iproute2 to make network namespaces")]

SECRET = "netns-failover-test-secret-0123456789"
OPTIONS = {"setup_sleep": 1.0}
"""Each rollout holds its request for a second, so the lost host has requests in flight."""


async def test_a_host_lost_mid_run_has_its_rollouts_completed_on_the_others_each_once(monkeypatch, tmp_path):
    monkeypatch.setenv(SECRET_ENV, SECRET)  # the servers (started with our environment) and the client share it
    with NetnsHosts(3) as hosts, contextlib.ExitStack() as stack:
        model = stack.enter_context(FakeOpenAIServer(rule=reply_with_word, host=hosts.gateway(0)))
        addresses = [stack.enter_context(local_server(SPEC, OPTIONS, workers=1, address=f"tcp://{hosts.address(i)}:0",
                                                      under=hosts.run_in(i), log_dir=tmp_path / f"host{i}"))
                     for i in range(3)]
        assert [a.rsplit(":", 1)[0] for a in addresses] == [f"tcp://{hosts.address(i)}" for i in range(3)]
        endpoint = Endpoint(base_url=model.base_url, model=model.model, api_key_env=None, max_retries=0)
        async with EnvClient(addresses, liveness_timeout=2.0, per_request=1) as client:
            run = asyncio.ensure_future(client.evaluate(Echo(OPTIONS), endpoint, num_tasks=9, concurrency=9))
            deadline = time.monotonic() + 20
            while [h.load for h in client.hosts] != [3, 3, 3] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert [h.load for h in client.hosts] == [3, 3, 3]
            hosts.cut(1)  # the host vanishes: no FIN, only silence
            cut = time.monotonic()
            traces = await asyncio.wait_for(run, 40)
            recovered = time.monotonic() - cut
    assert len(traces) == 9 and all(t.ok for t in traces), [t.errors for t in traces if not t.ok]
    assert len({(t.task_key, t.rollout_index) for t in traces}) == 9  # each once
    assert client.moved == 3 and recovered < 15, (client.moved, recovered)
