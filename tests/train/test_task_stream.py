"""TaskStream: one environment's tasks drawn from its env server by position: a finite taskset reshuffled each pass
in `Taskset.shuffle`'s order, an endless one read ahead of each step; a resume skips positions, not rows."""

import asyncio

import pytest

import tracegym as tg
from tracegym.core.errors import UsageError
from tracegym.serve.env_client import ask, describe
from tracegym.serve.local_server import local_server
from tracegym.train.task_stream import TaskStream

SAME_ROWS = '''import tracegym as tg


def make(config=None):
    return tg.Taskset(config, id="same", data=[{"prompt": "abc"}] * 4)
'''


class Reads:
    """A fake server's rows (`EnvClient.rows`): position p's prompt is `p`; every request is kept."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []

    async def __call__(self, positions) -> list[tg.TaskData]:
        self.asked.append(list(positions))
        return [tg.TaskData(prompt=str(p), id=str(p)) for p in positions]


def test_a_finite_stream_goes_through_every_row_in_a_new_order_each_pass():
    rows = [tg.TaskData(prompt=str(p), id=str(p)) for p in range(4)]
    stream = TaskStream("t", 4, seed=0, fetch=Reads(), rows=rows)
    epochs = [[stream.next().key for _ in range(4)] for _ in range(3)]
    assert all(sorted(keys) == ["0", "1", "2", "3"] for keys in epochs)
    assert len({tuple(keys) for keys in epochs}) > 1


def test_a_pass_is_in_the_order_taskset_shuffle_gives():
    taskset = tg.Taskset(id="t", data=[{"prompt": str(p), "id": str(p)} for p in range(7)])
    stream = TaskStream("t", 7, seed=3, fetch=Reads(), rows=list(taskset))
    assert [stream.next().key for _ in range(14)] == [d.key for d in [*taskset.shuffle(3), *taskset.shuffle(4)]]


def test_an_endless_stream_reads_ahead_of_a_step_in_one_request_and_keeps_no_row_it_drew():
    reads = Reads()
    stream = TaskStream("t", None, seed=0, fetch=reads)
    asyncio.run(stream.ahead(3))
    assert [stream.next().prompt for _ in range(3)] == ["0", "1", "2"]
    assert reads.asked == [[0, 1, 2]] and stream.rows == {}


def test_drawing_past_what_was_read_ahead_is_an_error_naming_the_environment():
    stream = TaskStream("counter", None, seed=0, fetch=Reads())
    with pytest.raises(UsageError, match="environment 'counter': task 0 was drawn before it was read"):
        stream.next()


def test_a_resumed_stream_skips_positions_without_reading_them():
    reads = Reads()
    stream = TaskStream("t", None, seed=0, fetch=reads)
    stream.skip_to(5)
    asyncio.run(stream.ahead(1))
    assert stream.next().prompt == "5" and reads.asked == [[5]]


def test_a_served_finite_taskset_of_identical_rows_keeps_every_rows_key(tmp_path):
    path = tmp_path / "same_rows.py"
    path.write_text(SAME_ROWS)
    with local_server(f"{path}:make", workers=1) as address:
        served = describe(address)
        rows = ask(address, lambda client: client.rows(range(served.size or 0)))
    stream = TaskStream("same", served.size, seed=0, fetch=Reads(), rows=rows)
    epochs = [[stream.next().key for _ in range(4)] for _ in range(3)]
    assert served.size == 4 and all(sorted(keys) == ["0", "1", "2", "3"] for keys in epochs)
