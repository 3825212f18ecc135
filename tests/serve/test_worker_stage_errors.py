"""Stage failures through an env server's worker are recorded as in process: what a reward raised or returned."""

import textwrap

from serve_helpers import running_server

import tracegym as tg
from tracegym.serve import EnvClient

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
            [trace] = [t async for t in client.evaluate_iter([(row, 0)], endpoint)]
    assert [(e.kind, e.stage) for e in trace.errors] == [
        (tg.ErrorKind.TASK, "scoring:remote"), (tg.ErrorKind.TASK, "scoring:text")]
    assert trace.errors[0].message.startswith("TimeoutError: socket (raised by the stage itself after")
    assert "'text' returned str '0.5'" in trace.errors[1].message
    assert trace.rewards["remote"].score is None and trace.rewards["text"].score is None
