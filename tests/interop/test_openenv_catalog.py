"""What an OpenEnv server offers, known before any session: its tools (so TRL's adapter sees them as methods it
describes, and the server's rewards reach TRL), one session per rollout, and its capacity where it can be learned;
against openenv's own `create_app` servers on loopback."""

import asyncio
import contextlib
import inspect
import logging
from typing import Literal

import pytest
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv_reference import EchoEnvironment, echo_server, guess_server
from transformers.utils import get_json_schema

from tracegym.interop.openenv_catalog import remote_function
from tracegym.interop.openenv_connection import OpenEnvConnection
from tracegym.interop.openenv_server import serving
from tracegym.interop.openenv_taskset import OpenEnvTaskset
from tracegym.interop.trl import environment_factory, reward_functions, train_dataset

NO_WAIT = {"retries": 0, "capacity_wait": 0}
"""A session the server cannot give at once is an error at once (so a second session held would show)."""


@contextlib.contextmanager
def holding_the_only_session(url):
    """The server's one session taken by another client for the `with` block."""
    holder = OpenEnvConnection(url)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(holder.open(seed=1))
        yield
    finally:
        loop.run_until_complete(holder.close())
        loop.close()


def _methods(env_class):
    return [n for n, _ in inspect.getmembers(env_class, inspect.isfunction)
            if n not in ("reset", "get_reward") and not n.startswith("_")]


def test_mcp_tools_are_known_before_setup_while_the_servers_only_session_is_taken():
    with echo_server(max_concurrent_envs=1) as url, holding_the_only_session(url):
        taskset = OpenEnvTaskset({"url": url, **NO_WAIT})
        specs = taskset.task(taskset[0]).tool_specs()
    assert [(s.name, s.parameters["required"]) for s in specs] == [("echo_message", ["message"])]


def test_trl_sees_an_mcp_servers_tools_as_methods_it_describes():
    with echo_server() as url:
        env_class = environment_factory(OpenEnvTaskset({"url": url}))
    assert _methods(env_class) == ["echo_message"]
    assert get_json_schema(env_class().echo_message)["function"] == {
        "name": "echo_message", "description": "Echo a message back.",
        "parameters": {"type": "object", "properties": {"message": {"type": "string", "description": "message"}},
                       "required": ["message"]}}


def test_trl_sees_an_action_schema_as_one_method_it_describes():
    with guess_server() as url:
        env_class = environment_factory(OpenEnvTaskset({"url": url}))
    assert _methods(env_class) == ["act"]
    parameters = get_json_schema(env_class().act)["function"]["parameters"]
    assert parameters == {"type": "object", "properties": {"guess": {
        "type": "integer", "description": "Your guess, from 1 to 100."}}, "required": ["guess"]}


def test_an_openenv_rollout_under_trls_environment_class_gets_the_servers_reward():
    with echo_server() as url:
        taskset = OpenEnvTaskset({"url": url, "num_tasks": 1})
        env_class, (env_reward, *_) = environment_factory(taskset), reward_functions(taskset)
        row = train_dataset(taskset)[0]
        env = env_class()
        env.reset(**row)
        said = env.echo_message(message="hello")
        rewards = env_reward(prompts=[row["prompt"]], completions=[[{"role": "assistant", "content": "done"}]],
                             completion_ids=[[1]], environments=[env])
    assert said == "hello" and rewards == [pytest.approx(0.5)]  # 0.1 per character echoed, from the server


def test_a_trl_environment_reset_again_without_scoring_holds_one_session_at_a_time():
    with echo_server(max_concurrent_envs=1) as url:
        taskset = OpenEnvTaskset({"url": url, "num_tasks": 2, **NO_WAIT})
        env = environment_factory(taskset)()
        rows = train_dataset(taskset)
        for row in (rows[0], rows[1], rows[0]):  # a rollout TRL never scored is closed by the next reset
            env.reset(**row)
            assert env.echo_message(message="hi") == "hi"
        env._cleanup()


def test_a_server_without_http_mcp_has_its_tools_listed_in_one_session_before_the_first_rollout():
    app = create_app(EchoEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=1)
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/mcp"
                         or "POST" not in getattr(r, "methods", ())]
    with serving(app) as url:
        taskset = OpenEnvTaskset({"url": url, **NO_WAIT})
        names = [t["name"] for t in taskset.offer().mcp_tools or ()]
        env = environment_factory(taskset)()  # the listing's session is closed: the only one is free again
        env.reset(**train_dataset(taskset, num_tasks=1)[0])
        said = env.echo_message(message="hi")
        env._cleanup()
    assert names == ["echo_message"] and said == "hi"


def test_a_full_servers_refusal_teaches_the_taskset_its_capacity_with_one_note(caplog):
    from tracegym import run_rollout
    from tracegym.testing import ScriptedModel

    with echo_server(max_concurrent_envs=1) as url, holding_the_only_session(url):
        taskset = OpenEnvTaskset({"url": url, "num_tasks": 2, **NO_WAIT})
        assert taskset.capacity() is None
        with caplog.at_level(logging.WARNING, logger="tracegym.interop.openenv_catalog"):
            refused = [asyncio.run(run_rollout(taskset, taskset[i], ScriptedModel(["x"]), infra_retries=0))
                       for i in range(2)]
    assert [t.failure for t in refused] == ["env_unavailable"] * 2
    assert taskset.capacity() == 1
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and f"OpenEnv server {url} holds at most 1 sessions" in notes[0] and "-c 1" in notes[0]


def saying_its_capacity(sessions):
    """An echo server whose /health says how many sessions it holds (`max_sessions`)."""
    app = create_app(EchoEnvironment, CallToolAction, CallToolObservation, max_concurrent_envs=sessions)
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", None) != "/health"]
    app.add_api_route("/health", lambda: {"status": "healthy", "max_sessions": sessions})
    return serving(app)


def test_a_server_whose_health_says_its_capacity_is_known_before_the_first_rollout():
    with saying_its_capacity(3) as url:
        capacity = OpenEnvTaskset({"url": url}).capacity()
    assert capacity == 3


def test_eval_runs_at_most_the_servers_capacity_at_once_whatever_c_says_with_a_note(caplog):
    from tracegym.eval.eval_config import parse_eval_args
    from tracegym.eval.eval_parts import eval_parts

    with saying_its_capacity(3) as url, caplog.at_level(logging.WARNING, logger="tracegym.eval.eval_parts"):
        taskset = OpenEnvTaskset({"url": url})
        cut = eval_parts(parse_eval_args([f"openenv:{url}", "-c", "8", "--no-serve"]), taskset).settings.concurrency
        kept = eval_parts(parse_eval_args([f"openenv:{url}", "-c", "2", "--no-serve"]), taskset).settings.concurrency
    assert (cut, kept) == (3, 2)
    assert [r.getMessage() for r in caplog.records] == [
        f"taskset openenv:{url} runs at most 3 rollouts at once (its server's capacity): -c 8 runs as -c 3"]


def test_a_remote_tools_function_reads_as_its_json_schema():
    schema = {"type": "object", "required": ["mode"], "properties": {
        "mode": {"type": "string", "enum": ["fast", "slow"], "description": "How to  run."},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels."},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Limit"}}}

    async def call(**arguments):
        return arguments

    fn = remote_function("run", "Run it.", schema, call)
    assert get_json_schema(fn)["function"] == {"name": "run", "description": "Run it.", "parameters": {
        "type": "object", "properties": {
            "mode": {"type": "string", "enum": ["fast", "slow"], "description": "How to run."},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Labels."},
            "limit": {"type": "integer", "nullable": True, "description": "Limit"}},
        "required": ["mode"]}}
    assert inspect.signature(fn).parameters["mode"].annotation == Literal["fast", "slow"]
    assert asyncio.run(fn(mode="fast")) == {"mode": "fast"}


def test_a_session_refused_while_this_tasksets_own_rollouts_hold_them_all_says_so():
    from tracegym.core.errors import InfrastructureError

    with echo_server(max_concurrent_envs=1) as url:  # TRL's batch of two rollouts, reset one after the other
        taskset = OpenEnvTaskset({"url": url, "num_tasks": 2, **NO_WAIT})
        env_class, rows = environment_factory(taskset), train_dataset(taskset)
        first, second = env_class(), env_class()
        first.reset(**rows[0])
        with pytest.raises(InfrastructureError, match="this taskset's own rollouts hold all 1 of its sessions"):
            second.reset(**rows[1])
        first._cleanup()  # the first rollout ends: its session is free for the next
        second.reset(**rows[1])
        said = second.echo_message(message="hi")
        second._cleanup()
    assert said == "hi"


def test_an_openenv_taskset_pickles_with_what_its_server_offers():
    import pickle

    with echo_server() as url:
        taskset = OpenEnvTaskset({"url": url})
        row = taskset[0]
    copy = pickle.loads(pickle.dumps(taskset))  # the server is gone: the copy's tools come from the pickled offer
    assert [s.name for s in copy.task(row).tool_specs()] == ["echo_message"]
