"""Parity across execution modes: one taskset, seed and scripted policy give the same traces in process
(`evaluate`, what `tracegym eval` runs), through the env server (`EnvServer`, its workers real processes, driven by
`EnvClient`), through the OpenEnv server (`OpenEnvServer`, played by our OpenEnv taskset client) and through the TRL
adapter (`environment_factory` and `reward_functions`, driven as GRPOTrainer drives them). A single-turn taskset
(reverse-text) and a multi-turn tool taskset (counter-env).

Compared on every path against the in-process traces: each message (role, text, tool calls, which call a tool
answer answers, the tool's name), which turns were sampled, the rewards of each reward function, the metrics, the
stop reason and the stop that fired, the errors, and the token ids (prompt and completion, with the mask and
logprobs) where the path records them. What is normalised, and why, is in NORMALISED; nothing else is.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from serve_helpers import running_server

from tracegym import Endpoint, Sampling, evaluate, load_taskset, run_rollout
from tracegym.core.trace import Trace
from tracegym.envs.rollout import LOOP_METRICS
from tracegym.interop import trl
from tracegym.interop.openenv_server import OpenEnvServer
from tracegym.interop.openenv_session import TasksetSession
from tracegym.interop.openenv_taskset import OpenEnvData, OpenEnvTaskset
from tracegym.models.client import ModelRequest
from tracegym.serve import EnvClient
from tracegym.testing import FakeOpenAIServer, ScriptedModel, reply, tool_call

TASKSETS = {"reverse-text": {"seed": 3}, "counter-env": {"seed": 3}}
"""The tasksets and options every path runs (the seed picks the phrases and the counters' starts and targets)."""
NUM_TASKS = 4
SAMPLING = Sampling(temperature=0.0, max_tokens=64)
MAX_TURNS = 10
"""TRL's tool loop bound in the driver (every counter episode here ends in fewer turns)."""

NORMALISED = {
    "every path": [
        "trace id, started_at, spans: a fresh id, the wall clock and durations differ between any two runs",
        "tool-call ids (and the tool answer's tool_call_id): each path makes its own (the scripted reply draws a new "
        "one per call, the OpenEnv server names calls call_<turn>_<i>, TRL's adapter call_<i>); a call is "
        "compared by its position in the trace, so which call each tool answer answers is still compared",
    ],
    "openenv client": [
        "taskset id: `openenv:ws://HOST:PORT` names the server the client played",
        "rewards and metrics: the client scores the episode by the reward the server sent (`env_reward`, with "
        "its own `env_steps`, `env_done`); the total is compared here, and each reward function's score and "
        "each metric on the served rollout's trace (the `openenv server` comparison)",
    ],
    "openenv server": [
        "model, sampling and token ids: the served rollout's model turns come from the remote agent, so its trace "
        "names the agent (`openenv-agent`) and holds no tokens; the agent's own trace (the client's) has them",
    ],
    "trl": [
        "model, sampling, usage, logprobs: TRL's adapter is given a prompt, a completion and its ids, nothing else",
        "token ids: TRL gives one id list for the whole completion, recorded on the first model turn; compared on "
        "the single-turn taskset, where that is the turn's completion (the multi-turn one's span tool answers, "
        "rendered by TRL's tokenizer)",
        "an assistant turn's content None (a tool-call turn) vs '': TRL's conversational messages always hold text",
        "tool-call arguments compared as parsed JSON: TRL hands them to the adapter parsed",
        "the loop's metrics (tool_calls, tool_errors, ...): counted by our rollout loop, and TRL's own tool loop "
        "ran this rollout; the task's metrics are compared",
    ],
}
"""What each comparison leaves out or reads another way, and why (legitimately the path's own)."""

_RULES = re.compile(r"starts at (\d+) and the target is (\d+)\. Each call moves it by 1 to (\d+)")
_NOW = re.compile(r"counter is now (-?\d+)")


def policy(request: ModelRequest) -> Any:
    """The scripted model, a function of the messages only: reverse-text phrases of odd length reversed exactly,
    others echoed (rewards 1.0 and below); a counter driven to its target by the largest steps allowed, then
    'done', over as many turns as it takes."""
    first = next(m.text for m in request.messages if m.role == "user")
    rules = _RULES.search(first)
    if rules is None:
        phrase = first.rsplit("\n\n", 1)[-1]
        return phrase[::-1] if len(phrase) % 2 else phrase
    count, target, step = map(int, rules.groups())
    for m in request.messages:
        if m.role == "tool" and (now := _NOW.search(m.text)):
            count = int(now.group(1))
    if count == target:
        return "done"
    move = "increment" if target > count else "decrement"
    return reply(None, tool_call(move, {"amount": min(step, abs(target - count))}))


# --- the paths -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    """The scripted policy behind an OpenAI-compatible endpoint (exact token ids and logprobs, as vLLM's)."""
    with FakeOpenAIServer(rule=policy) as server:
        yield Endpoint(base_url=server.base_url, model=server.model, api_key_env=None, max_retries=0)


@pytest.fixture(scope="module", params=list(TASKSETS))
def taskset_id(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def in_process(taskset_id: str, endpoint: Endpoint) -> list[Trace]:
    return asyncio.run(evaluate(load_taskset(taskset_id, TASKSETS[taskset_id]), endpoint, num_tasks=NUM_TASKS,
                                sampling=SAMPLING))


@pytest.fixture(scope="module")
def env_server(taskset_id: str, endpoint: Endpoint) -> list[Trace]:
    async def run(address: str) -> list[Trace]:
        async with EnvClient(address) as client:
            return await client.evaluate(load_taskset(taskset_id, TASKSETS[taskset_id]), endpoint,
                                         num_tasks=NUM_TASKS, sampling=SAMPLING)
    with running_server(TASKSETS[taskset_id], spec=taskset_id, ready_s=120) as server:  # a loaded machine
        return asyncio.run(run(server.bound))


class RecordingOpenEnvServer(OpenEnvServer):
    """Our OpenEnv server, keeping each session so that the test reads the served rollout's own trace."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sessions: list[TasksetSession] = []

    def _new_session(self) -> TasksetSession:
        session = super()._new_session()
        self.sessions.append(session)
        return session


@pytest.fixture(scope="module")
def openenv(taskset_id: str, endpoint: Endpoint) -> tuple[list[Trace], list[Trace]]:
    """The client's traces (the agent's side, with tokens) and the served rollouts' traces, in task order. The
    client resets each task by its key and reads the server's chat `messages`; a plain reply is its action."""
    taskset = load_taskset(taskset_id, TASKSETS[taskset_id])
    keys = [row.key for row in list(taskset)[:NUM_TASKS]]
    server = RecordingOpenEnvServer(taskset, max_concurrent_envs=8, workers=0)
    with server.running() as url:
        client = OpenEnvTaskset({"url": url, "instructions": "", "observation_field": "messages",
                                 "text_action": "message", "max_turns": MAX_TURNS})

        async def run() -> list[Trace]:
            return [await run_rollout(client, OpenEnvData(id=key, prompt="", reset={"key": key}), endpoint,
                                      sampling=SAMPLING) for key in keys]
        agent = asyncio.run(run())
    served = {s.trace.task_key: s.trace for s in server.sessions if s.trace is not None}
    return agent, [served[key] for key in keys]


@pytest.fixture(scope="module")
def trl_traces(taskset_id: str) -> list[Trace]:
    """The adapter's traces, its environment class, dataset and reward functions driven as GRPOTrainer drives them
    (`_generate_and_score_completions`, `_tool_call_loop`, `_calculate_rewards`) with the scripted policy as the
    model: one instance per row, `reset(**row)` appended to the last prompt message, each tool call as
    `method(**arguments)` answered by a `tool` message (an exception: `{"error": ...}`), then every reward function."""
    taskset = load_taskset(taskset_id, TASKSETS[taskset_id])
    factory, rows = trl.environment_factory(taskset), trl.train_dataset(taskset, num_tasks=NUM_TASKS)
    model = ScriptedModel(rule=policy, tokens=True)
    prompts, completions, ids, environments = [], [], [], []
    for row in rows:
        environment = factory()
        added = environment.reset(**row)
        prompt = [dict(m) for m in row["prompt"]]
        if added is not None:
            prompt[-1] = {**prompt[-1], "content": prompt[-1]["content"] + added}
        completion, sampled = trl_tool_loop(environment, prompt, model)
        prompts.append(prompt)
        completions.append(completion)
        ids.append(sampled)
        environments.append(environment)
    for function in trl.reward_functions(taskset):
        function(prompts=prompts, completions=completions, completion_ids=ids, environments=environments)
    return [environment._trace for environment in environments]


def trl_tool_loop(environment: Any, prompt: list[dict[str, Any]],
                  model: ScriptedModel) -> tuple[list[dict[str, Any]], list[int]]:
    """One rollout as TRL's tool loop runs it: the completion messages and the sampled ids."""
    completion: list[dict[str, Any]] = []
    sampled: list[int] = []
    for _ in range(MAX_TURNS):
        messages = [trl.from_trl(m) for m in prompt + completion]
        response = asyncio.run(model.complete(ModelRequest(messages=messages, sampling=SAMPLING)))
        sampled += response.completion_token_ids or []
        calls = [{"type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                 for c in response.message.tool_calls]
        completion.append({"role": "assistant", "content": response.message.text, **({"tool_calls": calls} if calls
                                                                                     else {})})
        if not calls:
            break
        for call in calls:
            try:
                result = getattr(environment, call["function"]["name"])(**call["function"]["arguments"])
            except Exception as exc:
                result = {"error": str(exc)}
            completion.append({"role": "tool", "name": call["function"]["name"], "content": str(result)})
    return completion, sampled


# --- the comparison ------------------------------------------------------------------------------------------


def content(trace: Trace, *, tokens: bool = True, scores: bool = True, parsed_arguments: bool = False,
            text_content: bool = False, loop_metrics: bool = True) -> dict[str, Any]:
    """What is compared of a trace: its messages (tool-call ids replaced by their position) with the nodes' token
    ids where `tokens`, and with `scores` its rewards, metrics (the loop's where `loop_metrics`), stop and
    errors."""
    positions: dict[str, int] = {}
    nodes = []
    for node in trace.graph.nodes:
        m = node.message
        calls = [(positions.setdefault(c.id, len(positions)), c.name,
                  json.loads(c.arguments) if parsed_arguments else c.arguments) for c in m.tool_calls]
        nodes.append({"role": m.role, "content": m.text if text_content else m.content, "calls": calls,
                      "answers": positions.get(m.tool_call_id) if m.tool_call_id else None, "name": m.name,
                      "sampled": node.sampled,
                      **({"tokens": (node.token_ids, node.mask, node.logprobs)} if tokens else {})})
    out: dict[str, Any] = {"task": trace.task_key, "nodes": nodes, "prompt_length": trace.prompt_length}
    if scores:
        metrics = {k: v for k, v in trace.metrics.items() if loop_metrics or k not in LOOP_METRICS}
        out |= {"rewards": {k: (r.score, r.weight) for k, r in trace.rewards.items()}, "metrics": metrics,
                "stop": (trace.stop_reason, trace.stopped_by), "errors": [(e.kind, e.stage) for e in trace.errors]}
    return out


def test_the_policy_scores_differently_across_tasks_so_parity_is_not_all_equal(in_process, taskset_id):
    assert all(t.ok for t in in_process) and len(in_process) == NUM_TASKS
    if taskset_id == "reverse-text":
        assert len({t.reward for t in in_process}) > 1
    else:
        assert {t.metrics["tool_calls"] for t in in_process} != {1.0}  # multi-turn: some take several calls
        assert all(t.num_turns >= 2 for t in in_process)


def test_env_server_traces_equal_in_process_traces(in_process, env_server):
    assert [content(t) for t in env_server] == [content(t) for t in in_process]
    assert [(t.model, t.sampling, t.usage) for t in env_server] == [(t.model, t.sampling, t.usage) for t in in_process]


def test_openenv_client_traces_equal_in_process_traces(in_process, openenv):
    agent, _ = openenv
    assert [content(t, scores=False) for t in agent] == [content(t, scores=False) for t in in_process]
    assert [(t.reward, t.stop_reason, t.stopped_by) for t in agent] == [(t.reward, t.stop_reason, t.stopped_by)
                                                                        for t in in_process]
    assert [t.metrics.get("tool_calls") for t in agent] == [t.metrics.get("tool_calls") for t in in_process]
    assert [(t.model, t.sampling, t.usage) for t in agent] == [(t.model, t.sampling, t.usage) for t in in_process]


def test_openenv_served_rollouts_equal_in_process_traces(in_process, openenv):
    _, served = openenv
    assert [content(t, tokens=False) for t in served] == [content(t, tokens=False) for t in in_process]


def test_trl_adapter_traces_equal_in_process_traces(in_process, trl_traces, taskset_id):
    single_turn = taskset_id == "reverse-text"
    seen_as_trl = {"tokens": False, "parsed_arguments": True, "text_content": True, "loop_metrics": False}
    assert [content(t, **seen_as_trl) for t in trl_traces] == [content(t, **seen_as_trl) for t in in_process]
    if single_turn:
        assert [_completion_ids(t) for t in trl_traces] == [_completion_ids(t) for t in in_process]


def _completion_ids(trace: Trace) -> list[list[int]]:
    """Each sampled turn's completion ids (the mask's 1s)."""
    return [[i for i, kept in zip(n.token_ids or [], n.mask or [], strict=True) if kept]
            for n in trace.graph.nodes if n.sampled]
