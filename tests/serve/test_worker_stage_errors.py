"""Stage failures through an env server's worker are recorded as in process: a hung model call, what a reward
raised or returned."""

import textwrap
import time

from serve_helpers import running_server, task

import tracegym as tg
from tracegym.serve import EnvClient
from tracegym.testing.echo import Echo

TASKSET = '''
import tracegym as tg


class Scores(tg.Task):
    @tg.reward
    def remote(self, trace):
        raise TimeoutError("socket")

    @tg.reward
    def text(self, trace):
        return "0.5"


class Raising(tg.Taskset):
    id = "raising"
    task_class = Scores
'''


async def test_a_worker_records_a_raised_timeout_error_and_a_string_reward_as_task_errors(tmp_path, endpoint):
    path = tmp_path / "raising.py"
    path.write_text(textwrap.dedent(TASKSET))
    row = tg.TaskData(prompt="Say hello.")
    with running_server(spec=f"{path}:Raising") as server:
        async with EnvClient(server.bound) as client:
            [trace] = [t async for t in client.evaluate_iter(f"{path}:Raising", endpoint, pairs=[(row, 0)])]
    assert [(e.kind, e.stage) for e in trace.errors] == [
        (tg.ErrorKind.TASK, "scoring:remote"), (tg.ErrorKind.TASK, "scoring:text")]
    assert trace.errors[0].message.startswith("TimeoutError: socket (raised by the stage itself after")
    assert trace.failure == tg.FailureKind.SCORING_ERROR and trace.errors[0].cause == ["TimeoutError: socket"]
    assert "'text' returned str '0.5'" in trace.errors[1].message
    assert trace.rewards["remote"].score is None and trace.rewards["text"].score is None


async def test_a_worker_ends_a_hung_model_call_at_the_model_stage_deadline(endpoint):
    retrying = endpoint.model_copy(update={"timeout": 0.5, "max_retries": 3})
    with running_server() as server:
        async with EnvClient(server.bound) as client:
            start = time.monotonic()
            [trace] = [t async for t in client.evaluate_iter(Echo(), retrying, pairs=[(task("sleep-30"), 0)],
                                                             timeouts=tg.Timeouts(model=0.5))]
            elapsed = time.monotonic() - start
    assert elapsed < 20 and trace.stop_reason == tg.StopReason.TIMEOUT  # not the 30 s stall, even on a loaded machine
    assert [(e.kind, e.stage, e.message) for e in trace.errors] == [
        (tg.ErrorKind.TIMEOUT, "model", "model timed out: the stage ran past 0.5 s")]
