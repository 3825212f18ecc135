"""The router: session affinity, least-loaded new sessions, a server lost (killed or hung) and put back."""

import asyncio
import collections
import time

import pytest

import tracegym as tg
from tracegym.core.messages import user
from tracegym.models.chat_client import ChatClient
from tracegym.models.client import ModelRequest
from tracegym.models.router import Router
from tracegym.models.transport import Unavailable
from tracegym.testing import FakeOpenAIServer
from tracegym.testing.echo import Echo

FAST = {"health_every": 0.1, "probe_timeout": 0.5, "backoff": 0.01, "api_key_env": None, "tokens": "off"}


def named(name: str, latency: float = 0.0) -> FakeOpenAIServer:
    """A fake server whose every reply is its own name (so a reply says which server answered)."""
    return FakeOpenAIServer(rule=lambda _: name, latency=latency, model="m").start()


@pytest.fixture
def two():
    servers = [named("a", latency=0.05), named("b", latency=0.05)]
    yield servers
    for server in servers:
        server.stop()


def router_over(servers: list[FakeOpenAIServer], **settings) -> Router:
    endpoint = tg.Endpoint(base_url=servers[0].base_url, model="m", replicas=[s.base_url for s in servers[1:]],
                           **{**FAST, **settings})
    router = tg.make_client(endpoint)
    assert isinstance(router, Router)
    return router


async def ask(router: Router, session: str | None, turn: int = 0) -> str:
    reply = await router.complete(ModelRequest(messages=[user(f"{session} turn {turn}")], session=session))
    return reply.message.text


async def sessions(router: Router, count: int, turns: int, prefix: str = "s") -> dict[str, list[str]]:
    """Run `count` sessions of `turns` turns at once; the servers that answered each, in turn order."""

    async def one(session: str) -> list[str]:
        return [await ask(router, session, turn) for turn in range(turns)]

    names = [f"{prefix}{i}" for i in range(count)]
    return dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))


async def test_every_turn_of_a_session_goes_to_one_server_and_new_sessions_spread_by_load(two):
    async with router_over(two) as router:
        served = await sessions(router, 8, 3)
    assert all(len(set(turns)) == 1 for turns in served.values()), served
    assert collections.Counter(turns[0] for turns in served.values()) == {"a": 4, "b": 4}
    assert router.stats.affinity_hits == 16 and router.stats.new_sessions == 8
    assert router.stats.affinity_rate() == 1.0 and router.stats.requests == 24


async def test_requests_without_a_session_take_turns_between_idle_servers(two):
    async with router_over(two) as router:
        answers = [await ask(router, None) for _ in range(6)]
    assert set(answers) == {"a", "b"}


async def test_a_server_killed_mid_run_costs_retries_only_and_is_put_back_when_it_answers_again(two):
    b = two[1]
    async with router_over(two) as router:
        running = asyncio.ensure_future(sessions(router, 8, 4))
        await asyncio.sleep(0.08)  # every session has started, half of them on b
        b.stop()
        served = await running  # every request answered: those in flight on b and b's later turns went to a
        assert router.stats.taken_out == 1 and router.stats.sessions_moved >= 1
        assert all(turns[-1] == "a" for turns in served.values())
        b.start()  # the same port again
        await asyncio.sleep(0.4)  # a probe or two
        assert router.stats.put_back == 1
        fresh = await sessions(router, 4, 1, prefix="new")
    assert {turns[0] for turns in fresh.values()} == {"a", "b"}


async def test_a_server_that_stops_answering_is_taken_out_by_its_probe_and_its_requests_finish_elsewhere(two):
    b = two[1]
    async with router_over(two, timeout=60.0) as router:
        b.hung = True
        started = time.monotonic()
        served = await sessions(router, 4, 1)  # two land on b and hang until its probe fails (0.1 s + 0.5 s)
        took = time.monotonic() - started
        assert {turns[0] for turns in served.values()} == {"a"} and took < 30, (served, took)  # not the 60 s
        assert router.stats.taken_out == 1
        b.hung = False
        await asyncio.sleep(0.4)
        assert router.stats.put_back == 1


async def test_with_every_server_down_a_request_fails_after_bounded_attempts_with_backoff(two):
    delays = []

    async def record(seconds: float) -> None:
        delays.append(seconds)

    for server in two:
        server.stop()
    endpoint = tg.Endpoint(base_url=two[0].base_url, model="m", replicas=[two[1].base_url], max_retries=3, **{
        k: v for k, v in FAST.items() if k != "backoff"})
    router = Router(endpoint, ChatClient, sleep=record)
    with pytest.raises(Unavailable, match="after 4 attempts"):
        await ask(router, "s")
    await router.aclose()
    assert router.stats.taken_out == 2 and len(delays) == 2  # the second server was tried at once, then backoff


async def test_a_caller_cancelling_a_request_is_not_retried(two):
    a, b = two
    a.hung = b.hung = True
    async with router_over(two, health_every=30.0) as router:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await ask(router, "s")
        assert router.stats.retries == 0 and router.stats.taken_out == 0
    a.hung = b.hung = False


async def test_a_rollout_keeps_its_turns_on_one_server_through_the_router(two):
    endpoint = tg.Endpoint(base_url=two[0].base_url, model="m", replicas=[two[1].base_url], **FAST)
    traces = await tg.evaluate(Echo({"turns": 3, "num_tasks": 6}), endpoint, concurrency=6)
    for trace in traces:
        replies = {m.text for m in trace.graph.messages() if m.role == "assistant"}
        assert len(replies) == 1 and len(trace.graph.messages()) >= 6, trace.graph.messages()
    assert {next(m.text for m in t.graph.messages() if m.role == "assistant") for t in traces} == {"a", "b"}
