"""image-tictactoe: the board as a picture from a tool (TRL image tool results), reward on the game's outcome."""

import io

from PIL import Image

import tracegym as tg
from tracegym.core.image_ref import image_bytes
from tracegym.core.messages import ImagePart
from tracegym.tasksets.image_tictactoe import BoardEnv, outcome
from tracegym.testing import ScriptedModel, reply, tool_call

SIZE = 96


def board_of(picture: Image.Image) -> list[str | None]:
    """The marks read off the picture: a black centre is X, a red top edge of the cell's mark is O."""
    cell, marks = SIZE // 3, []
    for i in range(9):
        left, top = (i % 3) * cell, (i // 3) * cell
        centre = picture.getpixel((left + cell // 2, top + cell // 2))
        edge = picture.getpixel((left + cell // 2, top + cell // 5 + 1))
        marks.append("X" if centre == (0, 0, 0) else "O" if edge == (220, 0, 0) else None)
    return marks


def player(request):
    """Looks at the board after each of its marks, then marks the first free cell it sees."""
    last = request.messages[-1]
    if last.role != "tool" or not isinstance(last.content, list):
        return reply(None, tool_call("show_board"))
    [part] = [p for p in last.content if isinstance(p, ImagePart)]
    board = board_of(Image.open(io.BytesIO(image_bytes(part.image_url["url"]))).convert("RGB"))
    return reply(None, tool_call("mark", {"cell": board.index(None) + 1}))


def test_the_board_picture_shows_each_mark_where_it_was_made():
    env = BoardEnv()
    env.reset(seed=3, size=SIZE)
    env.mark(5)
    board = board_of(env.show_board())
    assert board[4] == "X" and board.count("O") == 1 and board.count(None) == 7
    assert board == env.board


def test_a_game_ends_done_with_its_outcome_scored():
    env = BoardEnv()
    env.reset(seed=0, size=SIZE)
    while not env.done:
        env.mark(env.board.index(None) + 1)
    assert outcome([], [], [env]) == [{"X": 1.0, "O": 0.0, None: 0.5}[env.winner]]


async def test_a_model_playing_from_the_pictures_finishes_each_game_and_is_scored_on_it():
    taskset = tg.load_taskset("image-tictactoe", {"num_tasks": 4})
    traces = await tg.evaluate(taskset, ScriptedModel(rule=player), num_tasks=4)
    for trace in traces:
        assert trace.ok and trace.stopped_by == "done", trace.errors
        assert trace.reward in (0.0, 0.5, 1.0)
        shown = [m for m in trace.messages if m.role == "tool" and m.name == "show_board"]
        assert shown and all(isinstance(p, ImagePart) for m in shown for p in m.content)
