"""Thread lanes: hung sync tools are abandoned at their timeout and starve neither scorers, siblings nor exit."""

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import pytest

import tracegym as tg
from tracegym.core.errors import TaskExit
from tracegym.envs.thread_lane import LANE_LIMIT, ThreadLane
from tracegym.testing import ScriptedModel, reply, tool_call

GATE = threading.Event()
"""Holds every `stuck` call until the test that started them sets it (so no thread outlives its test)."""


def stuck(x: int) -> int:
    """Blocks until the test lets it go.

    Args:
        x: Returned as is.
    """
    GATE.wait()
    return x


def echo(x: int) -> int:
    """Returns its argument.

    Args:
        x: Returned as is.
    """
    return x


@tg.reward
def trivial(task, trace):
    return 1.0


def call_then_answer(tool_name):
    return ScriptedModel(rule=lambda r: reply(None, tool_call(tool_name, {"x": 7})) if len(r.messages) == 1
                         else "done")


@pytest.fixture
def gate():
    GATE.clear()
    yield GATE
    GATE.set()


async def test_more_hung_sync_tools_than_the_lane_holds_leave_every_sibling_reward_scored(gate):
    n = LANE_LIMIT + 8
    ts = tg.Taskset(id="hung", data=[{"prompt": "go"}], rewards=[trivial], tools=[stuck])
    traces = await tg.evaluate(ts, call_then_answer("stuck"), rollouts=n, concurrency=n,
                               timeouts=tg.Timeouts(tool=0.05, scoring=2.0))
    assert [t.rewards["trivial"].score for t in traces] == [1.0] * n
    assert {(e.kind, e.stage) for t in traces for e in t.errors} == {(tg.ErrorKind.TIMEOUT, "tool:stuck")}


async def test_healthy_sync_tools_still_run_after_hung_ones_filled_the_lane(gate):
    hung = tg.Taskset(id="hung", data=[{"prompt": "go"}], tools=[stuck])
    await tg.evaluate(hung, call_then_answer("stuck"), rollouts=LANE_LIMIT + 1, concurrency=LANE_LIMIT + 1,
                      timeouts=tg.Timeouts(tool=0.05))
    healthy = tg.Taskset(id="healthy", data=[{"prompt": "go"}], tools=[echo])
    [trace] = await tg.evaluate(healthy, call_then_answer("echo"), timeouts=tg.Timeouts(tool=2.0))
    assert trace.errors == [] and trace.messages[2].text == "7"


async def test_more_hung_sync_rewards_than_the_lane_holds_leave_every_other_reward_scored(gate):
    @tg.reward
    def hung(task, trace):
        GATE.wait()
        return 1.0

    n = LANE_LIMIT + 8
    ts = tg.Taskset(id="hung", data=[{"prompt": "go"}], rewards=[hung, trivial])
    traces = await tg.evaluate(ts, ScriptedModel(["done"]), rollouts=n, concurrency=n,
                               timeouts=tg.Timeouts(scoring=0.5))  # both rewards' timeout: room for a loaded CI
    assert [(t.rewards["hung"].score, t.rewards["trivial"].score) for t in traces] == [(None, 1.0)] * n


async def test_a_call_abandoned_at_its_timeout_frees_its_slot_at_once(gate):
    lane = ThreadLane("test", limit=1)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(lane.call(GATE.wait), 0.05)
    assert lane.abandoned == 1
    assert await asyncio.wait_for(lane.call(lambda: "free"), 2.0) == "free"


async def test_an_abandoned_call_that_returns_later_is_no_longer_counted(gate):
    lane = ThreadLane("test")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(lane.call(GATE.wait), 0.05)
    gate.set()
    deadline = time.monotonic() + 2
    while lane.abandoned and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert lane.abandoned == 0


async def test_a_lane_never_runs_more_than_limit_sync_calls_at_once():
    lane, active, most, lock = ThreadLane("test", limit=2), [0], [0], threading.Lock()

    def busy():
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1

    await asyncio.gather(*(lane.call(busy) for _ in range(6)))
    assert most[0] == 2


async def test_a_thread_waiting_for_work_keeps_nothing_of_its_last_result():
    class Made:
        pass

    made = weakref.ref(await ThreadLane("test").call(Made))
    for _ in range(3):  # the loop's own handles of the settled future go with its next turns
        await asyncio.sleep(0)
    gc.collect()
    assert made() is None


async def test_an_idle_thread_is_reused_by_the_next_call():
    lane = ThreadLane("test")
    first = await lane.call(threading.get_ident)
    assert await lane.call(threading.get_ident) == first


def lane_threads(name):
    return [t for t in threading.enumerate() if t.name == f"tracegym-{name}"]


async def test_threads_freed_by_returning_hung_calls_beyond_the_limit_end(gate):
    lane = ThreadLane("capped", limit=2)
    for _ in range(3):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(lane.call(GATE.wait), 0.05)
    assert len(lane_threads("capped")) == 3
    gate.set()
    deadline = time.monotonic() + 2
    while len(lane_threads("capped")) > 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(lane_threads("capped")) == 2


async def test_a_sync_call_returns_its_value_and_raises_its_exception():
    lane = ThreadLane("test")
    assert await lane.call(lambda a, b=0: a + b, 1, b=2) == 3
    with pytest.raises(KeyError, match="gone"):
        await lane.call(lambda: {}["gone"])


async def test_an_async_callable_is_awaited_on_the_loop_not_in_a_thread():
    async def where():
        return threading.current_thread() is threading.main_thread()

    assert await ThreadLane("test").call(where) is True


def raiser(exc: BaseException):
    def fn():
        raise exc

    return fn


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt(), asyncio.CancelledError()])
async def test_a_base_exception_raised_on_a_lane_thread_reaches_the_caller_as_an_ordinary_task_error(exc):
    with pytest.raises(TaskExit, match=f"^{type(exc).__name__}: "):  # never a Ctrl-C or our cancellation there
        await ThreadLane("test").call(raiser(exc))


async def test_async_task_code_raising_system_exit_is_contained_but_cancellation_and_ctrl_c_pass():
    async def raises(exc):
        raise exc

    lane = ThreadLane("test")
    with pytest.raises(TaskExit, match=r"^SystemExit: 3$"):
        await lane.call(raises, SystemExit(3))
    with pytest.raises(asyncio.CancelledError):
        await lane.call(raises, asyncio.CancelledError())
    with pytest.raises(KeyboardInterrupt):  # may be the user's Ctrl-C: it ends the eval
        await lane.call(raises, KeyboardInterrupt())


NEVER_RETURNS = textwrap.dedent('''
    import asyncio, threading
    import tracegym as tg
    from tracegym.testing import ScriptedModel, reply, tool_call

    def forever(x: int) -> int:
        """Never returns.

        Args:
            x: Ignored.
        """
        threading.Event().wait()

    ts = tg.Taskset(id="forever", data=[{"prompt": "go"}], tools=[forever])
    model = ScriptedModel([reply(None, tool_call("forever", {"x": 1})), "done"])
    [trace] = asyncio.run(tg.evaluate(ts, model, timeouts=tg.Timeouts(tool=0.1)))
    print(trace.stop_reason.value, [e.stage for e in trace.errors])
''')


def test_a_process_whose_sync_tool_never_returns_still_exits():
    done = subprocess.run([sys.executable, "-c", NEVER_RETURNS], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed ['tool:forever']"
