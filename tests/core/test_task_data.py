"""TaskData: equality by content, so a subclass's row survives the JSON round trip of its trace."""

from tracegym.core.task_data import TaskData
from tracegym.core.trace import Trace
from tracegym.testing import make_trace


class Board(TaskData):
    """A task-specific row: nested lists, a tuple and a defaulted field."""

    cells: list[list[str]]
    size: tuple[int, int] = (3, 3)
    level: int = 1


def board(last: str = "x") -> Board:
    return Board(prompt="play", answer="x", cells=[["x", "o"], ["", last]])


def test_a_subclass_row_equals_the_plain_taskdata_it_reads_back_as():
    row = board()
    back = TaskData.model_validate_json(row.model_dump_json())
    assert type(back) is TaskData and back == row and back.key == row.key
    assert hash(back) == hash(row)


def test_rows_with_different_content_differ():
    assert board() != board(last="o")
    assert TaskData(prompt="a") != TaskData(prompt="a", answer=1)


def test_a_row_never_equals_something_that_is_not_a_row():
    assert board() != board().model_dump(mode="json") and TaskData(prompt="a") != "a"


def test_a_trace_of_a_subclass_row_round_trips_through_json_equal_and_with_equal_dumps():
    trace = make_trace(task=board())
    back = Trace.model_validate_json(trace.model_dump_json())
    assert back.model_dump(mode="json") == trace.model_dump(mode="json")
    assert back == trace
