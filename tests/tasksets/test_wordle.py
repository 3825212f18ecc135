"""wordle: Wordle's feedback with repeated letters, guess parsing, the game loop, the win and greens rewards."""

import re

import pytest

import tracegym as tg
from tracegym.tasksets.wordle import WORDS, feedback, parse_guess
from tracegym.testing import ScriptedModel

_MARKS = re.compile(r"^([A-Z]{5}): ([GYX](?: [GYX]){4})$", re.MULTILINE)


def first_game() -> tuple[tg.Taskset, str]:
    ts = tg.load_taskset("wordle").head(1)
    [data] = ts
    return ts, data.answer


def keeps_to_the_feedback(request) -> str:
    """A player that guesses the first shipped word consistent with all the feedback so far."""
    seen = [(m[0].lower(), m[1].replace(" ", "")) for msg in request.messages if msg.role == "user"
            for m in _MARKS.findall(msg.text)]
    candidates = [w for w in WORDS if all(feedback(g, w) == marks for g, marks in seen)]
    return f"My guess: <guess>{candidates[0]}</guess>"


@pytest.mark.parametrize(
    ("guess", "target", "marks"),
    [
        ("eerie", "crane", "XXYXG"),  # one e in the target, already green: the other two are grey
        ("kebab", "abbey", "XYGYY"),  # the second b is yellow: the target has a b left beyond the green one
        ("llama", "hello", "YYXXX"),  # two l's, both elsewhere: both yellow
        ("lolly", "hello", "XYGGX"),  # three l's, two green: the third is grey
        ("geese", "those", "XXXGG"),  # the green e uses the only e
        ("motor", "robot", "XGYGY"),
        ("crane", "crane", "GGGGG"),
        ("pupil", "ocean", "XXXXX"),
    ],
)
def test_feedback_handles_repeated_letters_like_wordle(guess, target, marks):
    assert feedback(guess, target) == marks


def test_word_list_is_five_distinct_lowercase_letters_each():
    assert len(WORDS) >= 300 and len(set(WORDS)) == len(WORDS)
    assert all(re.fullmatch(r"[a-z]{5}", w) for w in WORDS)


def test_parse_guess_takes_the_last_tag():
    assert parse_guess("<guess>crane</guess> no, <GUESS> Slate </guess>") == "slate"
    assert parse_guess("crane") is None


def test_hidden_words_are_deterministic_for_a_seed():
    first = [d.answer for d in tg.load_taskset("wordle").head(8)]
    assert first == [d.answer for d in tg.load_taskset("wordle").head(8)]
    assert first != [d.answer for d in tg.load_taskset("wordle", {"seed": 1}).head(8)]


async def test_right_first_guess_wins_and_stops_the_game():
    ts, answer = first_game()
    traces = await tg.evaluate(ts, ScriptedModel(rule=lambda r: f"<guess>{answer}</guess>"), rollouts=2)
    assert [t.reward for t in traces] == [1.0, 1.0]
    assert all(t.stopped_by == "solved" and t.metrics["guesses_used"] == 1 for t in traces)
    assert traces[0].messages[-1].text.endswith("Solved!")


async def test_player_that_keeps_to_the_feedback_wins_every_game():
    traces = await tg.evaluate("wordle", ScriptedModel(rule=keeps_to_the_feedback), num_tasks=5)
    assert [t.reward for t in traces] == [1.0] * 5
    assert all(t.stop_reason == tg.StopReason.STOP_CONDITION for t in traces)


async def test_wrong_guesses_lose_after_six_with_partial_credit_for_greens():
    ts, answer = first_game()
    guess = next(w for w in WORDS if w != answer and "G" in feedback(w, answer))
    [trace] = await tg.evaluate(ts, ScriptedModel(rule=lambda r: f"<guess>{guess}</guess>"))
    assert trace.stop_reason == tg.StopReason.MAX_TURNS and trace.metrics["guesses_used"] == 6
    assert trace.rewards["won"].score == 0.0
    assert trace.reward == pytest.approx(0.2 * feedback(guess, answer).count("G") / 5)
    assert answer in trace.messages[-1].text


async def test_invalid_guesses_get_a_message_and_use_a_turn():
    ts, answer = first_game()
    script = ["I think it is crane", "<guess>toolong</guess>", f"<guess>{answer}</guess>"]
    [trace] = await tg.evaluate(ts, ScriptedModel(script))
    users = [m.text for m in trace.completion if m.role == "user"]
    assert "No guess found" in users[0] and "'toolong' is not a five-letter word" in users[1]
    assert "4 left" in users[1]
    assert trace.metrics["invalid_guesses"] == 2 and trace.metrics["guesses_used"] == 3
    assert trace.reward == 1.0


async def test_greens_count_the_last_valid_guess():
    ts, answer = first_game()
    guess = next(w for w in WORDS if w != answer and "G" in feedback(w, answer))
    [trace] = await tg.evaluate(ts, ScriptedModel([f"<guess>{guess}</guess>"], rule=lambda r: "no tag"))
    assert trace.metrics["invalid_guesses"] == 5
    assert trace.rewards["greens"].score == feedback(guess, answer).count("G") / 5
