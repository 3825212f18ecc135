"""TaskStream: the orchestrator's endless, reshuffled stream of one environment's rows keeps each row's key."""

from tracegym.train.orchestrator import TaskStream
from tracegym.train.rl_config import EnvChoice

SAME_ROWS = '''import tracegym as tg


def make(config=None):
    return tg.Taskset(config, id="same", data=[{"prompt": "abc"}] * 4)
'''


def test_a_reshuffled_stream_of_identical_rows_keeps_every_rows_key(tmp_path):
    path = tmp_path / "same_rows.py"
    path.write_text(SAME_ROWS)
    stream = TaskStream(EnvChoice(id=f"{path}:make"), seed=0)
    epochs = [[stream.next().key for _ in range(4)] for _ in range(3)]
    assert all(sorted(keys) == ["0", "1", "2", "3"] for keys in epochs)
    assert len({tuple(keys) for keys in epochs}) > 1  # each epoch is shuffled anew
