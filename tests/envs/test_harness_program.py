"""A program harness runs a program per rollout in the task's sandbox (subprocess, bubblewrap), its model calls
through the proxy onto the rollout's trace; its exit status, output and working directory are the rewards' (then
removed); its stages are timed spans; and every way a program can go wrong ends its own rollout with a clear error
naming the stage, while the rollouts beside it, and the proxy, go on."""

import asyncio

import pytest

from tracegym.core.errors import ErrorKind, UsageError
from tracegym.core.sampling import Sampling
from tracegym.core.task_data import TaskData
from tracegym.core.trace import StopReason
from tracegym.envs.harness import ProgramHarness
from tracegym.envs.rollout import Timeouts, rollout
from tracegym.envs.scorers import reward
from tracegym.envs.task import Task
from tracegym.runtimes.catalog import runtime_for
from tracegym.runtimes.sandbox import Limits
from tracegym.testing import ScriptedModel, Stall

ASK = """
import json, os, sys, urllib.request
def ask(messages):
    body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": messages}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]
"""
"""A program's model call in plain Python (no SDK, so it starts in milliseconds)."""

ONE_CALL = ASK + """
reply = ask(json.loads(os.environ["TRACEGYM_MESSAGES"]))
open("out.txt", "w").write(reply["content"])
print("said", reply["content"])
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""

QUICK = Limits(wall_seconds=20)


class Echoed(Task):
    """Rewards read the program's file, exit status and stdout."""

    @reward
    def wrote_it(self, trace) -> float:
        return float(self.program.file("out.txt") == "hello" and "said hello" in self.program.result.stdout)

    @reward
    def exit_zero(self, trace) -> float:
        return float(self.program.exit_code == 0)


def python(code: str, *args: str) -> list[str]:
    return ["python3", "-c", code.replace("{", "{{").replace("}", "}}"), *args]


class InRuntime(Echoed):
    """Runs in the runtime its `runtime_name` names."""

    runtime_name = "subprocess"

    def runtime(self):
        return runtime_for(self.runtime_name)


async def run(harness: ProgramHarness, client=None, runtime: str = "subprocess", **timeouts):
    task = InRuntime(TaskData(prompt="say hello", system_prompt="be brief"))
    task.runtime_name = runtime
    task.harness = harness
    client = client or ScriptedModel(["hello"], tokens=True)
    return task, await rollout(task, client, Sampling(max_tokens=32), timeouts=Timeouts(**timeouts))


BWRAP = runtime_for("bubblewrap").unavailable()


@pytest.mark.parametrize("runtime", ["subprocess", pytest.param("bubblewrap", marks=pytest.mark.skipif(
    BWRAP is not None, reason=str(BWRAP)))])
async def test_a_program_run_is_recorded_on_its_trace_and_read_by_rewards(runtime):
    task, trace = await run(ProgramHarness(python(ONE_CALL), limits=QUICK), runtime=runtime)
    assert not trace.errors and trace.stop_reason == StopReason.COMPLETED
    assert trace.reward == 2.0
    assert [m.role for m in trace.messages] == ["system", "user", "assistant"] and trace.prompt_length == 2
    assert trace.graph.nodes[-1].token_ids and trace.graph.nodes[-1].logprobs  # exact tokens from the client
    assert [s.name for s in trace.spans] == ["setup", "setup:program", "model", "program", "scoring", "total"]
    assert task.program.calls == 1
    assert not task.program.workdir.exists()  # removed after scoring


async def test_its_exit_status_is_data_for_the_rewards_not_an_error():
    task, trace = await run(ProgramHarness(python(ONE_CALL, "3"), limits=QUICK))
    assert trace.stop_reason == StopReason.COMPLETED and not trace.errors
    assert task.program.exit_code == 3 and trace.rewards["exit_zero"].score == 0.0


async def test_files_and_a_setup_command_prepare_the_working_directory_in_their_own_stage():
    read = ASK + ("open('data/mine.txt', 'w').write('the folder is the program\\'s');"
                  "ask([{'role': 'user', 'content': open('data/task.txt').read() + open('ready').read()}])")
    harness = ProgramHarness(python(read), files=lambda task: {"data/task.txt": task.data.prompt},
                             setup=["sh", "-c", "echo set up for {task_key} > ready"], limits=QUICK)
    model = ScriptedModel(["ok"])
    task, trace = await run(harness, model)
    assert not trace.errors, trace.errors
    assert model.requests[0].messages[0].text == f"say helloset up for {trace.task_key}\n"
    assert task.program.setup.ok and trace.duration("setup") >= trace.duration("setup:program") > 0


@pytest.mark.parametrize(("harness", "stage", "kind", "said", "runtime"), [
    (ProgramHarness(["no-such-agent-program", "--go"]), "program", ErrorKind.TASK, "could not start", "subprocess"),
    (ProgramHarness(python("print('thinking, never asking')")), "program", ErrorKind.TASK,
     "never called the model: it exited with status 0", "subprocess"),
    (ProgramHarness(python("import sys; sys.exit('gave up at once')")), "program", ErrorKind.TASK,
     "never called the model: it exited with status 1: gave up at once", "subprocess"),
    (ProgramHarness(python("print('never')"), setup=["sh", "-c", "echo no room >&2; exit 4"]), "setup:program",
     ErrorKind.TASK, "the setup command 'sh' exited with status 4: no room", "subprocess"),
    pytest.param(ProgramHarness(python(ONE_CALL)), "setup:program", ErrorKind.INFRASTRUCTURE,
                 "runtime 'container' is unavailable on this host", "container",
                 marks=pytest.mark.skipif(runtime_for("container").unavailable() is None,
                                          reason="this host has the container runtime")),
    (ProgramHarness(python(ONE_CALL), files=lambda task: {"../escape.txt": "x"}), "setup:program", ErrorKind.TASK,
     "must be a relative path inside the working directory", "subprocess"),
    (ProgramHarness(python("import time; time.sleep(60)"), limits=Limits(wall_seconds=1, network=True)),
     "program", ErrorKind.TIMEOUT, "ran past its time limit", "subprocess"),
])
async def test_a_program_gone_wrong_ends_its_rollout_with_an_error_naming_the_stage(harness, stage, kind, said,
                                                                                    runtime):
    task, trace = await run(harness, runtime=runtime)
    [error] = trace.errors
    assert (error.stage, error.kind) == (stage, kind) and said in error.message, error
    assert trace.stop_reason == (StopReason.TIMEOUT if kind == ErrorKind.TIMEOUT else StopReason.ERROR)
    assert all(r.score is None for r in trace.rewards.values())  # unscored, as a loop's failed rollout
    assert task.program is None or not task.program.workdir.exists()


async def test_a_malformed_call_is_a_400_to_the_program_and_an_error_at_the_model_stage():
    bad = ASK + """
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=b'{"messages": "hi"}')
try:
    urllib.request.urlopen(request)
except urllib.error.HTTPError as exc:
    print(exc.code, json.load(exc)["error"]["param"])
import time; time.sleep(30)  # the harness ends it: the rollout is over
"""
    task, trace = await run(ProgramHarness(python(bad), limits=QUICK))
    [error] = trace.errors
    assert (error.stage, error.kind) == ("model", ErrorKind.TASK) and "malformed" in error.message
    assert trace.stop_reason == StopReason.ERROR and trace.duration("program") < 25  # not its 30 s sleep
    assert task.program.result is None  # cancelled, its process tree reaped


async def test_a_model_call_past_its_timeout_ends_the_rollout_and_the_program():
    _, trace = await run(ProgramHarness(python(ONE_CALL), limits=QUICK), ScriptedModel([Stall(None)]), model=0.5)
    [error] = trace.errors
    assert (error.stage, error.kind) == ("model", ErrorKind.TIMEOUT)
    assert trace.stop_reason == StopReason.TIMEOUT and trace.duration("program") < 25  # the stall is endless


async def test_the_rollout_deadline_ends_a_program_that_runs_on():
    stays = ASK + "ask(json.loads(os.environ['TRACEGYM_MESSAGES']))\nimport time; time.sleep(60)"
    task, trace = await run(ProgramHarness(python(stays), limits=QUICK), rollout=2.0)
    assert trace.stop_reason == StopReason.TIMEOUT and [e.stage for e in trace.errors] == ["rollout"]
    assert trace.num_turns == 1 and trace.duration() < 30  # not its 60 s sleep
    assert not task.program.workdir.exists()


async def test_a_bad_rollout_leaves_the_ones_beside_it_whole():
    good = ProgramHarness(python(ONE_CALL), limits=QUICK)
    bad = ProgramHarness(["no-such-agent-program"])
    results = await asyncio.gather(*(run(h) for h in (good, bad, good)))
    assert [t.stop_reason for _, t in results] == [StopReason.COMPLETED, StopReason.ERROR, StopReason.COMPLETED]
    assert [t.reward for _, t in results] == [2.0, None, 2.0]


@pytest.mark.parametrize(("make", "said"), [
    (lambda: ProgramHarness([]), "non-empty list"),
    (lambda: ProgramHarness("agent --go"), "non-empty list"),
    (lambda: ProgramHarness(["agent", "{promt}"]), "harness command: '{promt}' names {promt}; known: {prompt}"),
    (lambda: ProgramHarness(["agent"], env={"X": "{key}"}), "harness env"),
    (lambda: ProgramHarness(["agent"], setup=["fetch", "{base_url}"]), "harness setup"),
    (lambda: ProgramHarness(["agent", "{"]), "not a valid template"),
])
def test_a_harness_that_cannot_work_is_refused_when_it_is_made(make, said):
    with pytest.raises(UsageError) as raised:
        make()
    assert said in str(raised.value)


@pytest.mark.parametrize("argument", ["--api-key={api_key}", "{base_url}"])
def test_a_harness_command_naming_the_proxy_key_is_refused_for_the_environment(argument):
    with pytest.raises(UsageError) as raised:
        ProgramHarness(["agent", argument])
    assert "OPENAI_API_KEY" in str(raised.value) and "environment only" in str(raised.value)


def test_a_harness_env_value_may_name_the_proxy_key():
    assert ProgramHarness(["agent"], env={"AGENT_API_KEY": "{api_key}", "AGENT_URL": "{base_url}"}).env


async def test_the_program_is_told_the_proxy_and_the_task_and_nothing_of_the_hosts_environment(monkeypatch):
    monkeypatch.setenv("HOST_SECRET", "s3cret")
    show = ONE_CALL.replace("print(", "print(sorted(k for k in os.environ if k != 'PWD'), ")
    harness = ProgramHarness(python(show), env={"AGENT_FLAGS": "--model={model} --key={api_key}"}, limits=QUICK)
    task, trace = await run(harness)
    seen = task.program.result.stdout
    for name in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "TRACEGYM_PROMPT", "TRACEGYM_MESSAGES",
                 "AGENT_FLAGS"):
        assert f"'{name}'" in seen
    assert "HOST_SECRET" not in seen and not trace.errors


@pytest.mark.parametrize("runtime", ["subprocess", pytest.param("bubblewrap", marks=pytest.mark.skipif(
    BWRAP is not None, reason=str(BWRAP)))])
async def test_without_network_the_program_reaches_the_proxy_and_nothing_else_on_loopback(runtime):
    """A program under the default limits (no network) cannot reach a canary on the host's 127.0.0.1 (where the
    model server's admin routes and the env server listen) while its model calls still land on the trace."""
    from tracegym.runtimes.limited_process import detect_isolation
    if runtime == "subprocess" and detect_isolation() == "process-group":
        pytest.skip("the process-group fallback has no network namespace (documented: no network isolation)")
    hits = []

    async def canary(reader, writer):
        hits.append(await reader.read(100))
        writer.close()

    server = await asyncio.start_server(canary, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', " + str(port) + "), timeout=2)"
             ".sendall(b'escaped')\n    print('canary reached')\nexcept OSError as exc:\n"
             "    print('canary refused', exc)\n")
    async with server:
        task, trace = await run(ProgramHarness(python(probe + ONE_CALL), limits=Limits(wall_seconds=20)),
                                runtime=runtime)
        await asyncio.sleep(0.2)
    assert hits == [] and "canary refused" in task.program.result.stdout, task.program.result
    assert not trace.errors and trace.stop_reason == StopReason.COMPLETED and trace.reward == 2.0
    assert [m.role for m in trace.messages] == ["system", "user", "assistant"] and task.program.calls == 1


def test_the_default_limits_keep_the_network_off():
    assert ProgramHarness(["true"]).limits.network is False


async def test_a_runtime_that_cannot_carry_the_proxy_fails_at_setup_saying_why():
    """A runtime whose sandboxes cannot carry a connection to the host (`Sandbox.cannot_forward`): a program
    without network there could not reach the proxy, so the rollout fails at setup:program naming why."""
    from tracegym.runtimes.process_sandbox import Confinement, ProcessSandbox

    class Forwardless(Confinement):
        cannot_forward = "this runtime runs programs without a way to the host"

    class EngineLess:
        name = "forwardless"

        def unavailable(self):
            return None

        async def open(self):
            return ProcessSandbox(Forwardless(), Limits())

    task = InRuntime(TaskData(prompt="say hello"))
    task.runtime = EngineLess
    task.harness = ProgramHarness(python(ONE_CALL))
    trace = await rollout(task, ScriptedModel(["hello"]))
    [error] = trace.errors
    assert (error.stage, error.kind) == ("setup:program", ErrorKind.INFRASTRUCTURE), error
    assert "cannot reach the interception proxy: this runtime runs programs without a way" in error.message
