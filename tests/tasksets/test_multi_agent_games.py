"""Tic-tac-toe's referee and the debate's judge over scripted members."""

import tracegym as tg
from tracegym.core.episode import Outcome
from tracegym.envs.evaluate import evaluate_episodes, run_episode
from tracegym.envs.registry import load_taskset
from tracegym.testing import ScriptedModel


def by_member(**replies: list[str]) -> ScriptedModel:
    """Each member answers from its own list in turn (the member is named in its system prompt)."""
    said = {member: iter(texts) for member, texts in replies.items()}

    def rule(request):
        head = request.messages[0].text
        return next(next(it for member, it in said.items() if f"You are {member}" in head or
                         (member == "judge" and "judge" in head)))
    return ScriptedModel(rule=rule)


async def game(opening: list[int], **replies: list[str]):
    taskset = load_taskset("tictactoe")
    row = taskset.as_data({"prompt": "A new game begins.", "opening": opening, "id": "g"})
    return await run_episode(taskset, row, by_member(**replies))


async def test_three_in_a_row_wins_and_a_full_board_draws():
    won = await game([], player_x=["1", "I take 5", "9"], player_o=["2", "3"])
    assert won.outcomes == {"player_x": Outcome.WIN, "player_o": Outcome.LOSS}
    assert won.rewards == {"player_x": 1.0, "player_o": -1.0} and won.member_metrics["player_x"]["moves"] == 5
    drawn = await game([0, 1, 2, 4, 3, 5], player_x=["8", "9"], player_o=["7"])  # X O X / X O O / . . .
    assert drawn.outcomes == {"player_x": Outcome.DRAW, "player_o": Outcome.DRAW} and drawn.rewards["player_o"] == 0.0


async def test_a_taken_cell_is_retried_and_the_board_is_shown():
    episode = await game([4], player_o=["5", "<think>5 is taken</think> 1"], player_x=["9", "2", "3"])
    o_view = [m.text for m in episode.traces["player_o"].messages]
    assert "Invalid move: cell 5 is taken. Try again." in o_view
    assert "Board:\n1 | 2 | 3\n4 | X | 6\n7 | 8 | 9\nYou are O. Your move (a free cell number)?" in o_view
    assert episode.member_metrics["player_o"]["invalid_moves"] == 1


async def test_debate_debaters_argue_at_once_and_the_judge_decides():
    taskset = load_taskset("debate", {"rounds": 2})
    row = taskset[0]
    right = next(d for d, side in row.sides.items() if side == row.answer)
    model = by_member(debater_a=["<think>hmm</think>A1", "A2"], debater_b=["B1", "B2"],
                      judge=[f"Convincing. VERDICT: {row.answer}"])
    episode = await run_episode(taskset, row, model)
    assert episode.ok and episode.metrics["slots"] == 3
    assert episode.rewards[right] == 1.0 and episode.rewards["judge"] == 1.0 and sum(episode.rewards.values()) == 2
    assert episode.trainable == {"debater_a": True, "debater_b": True, "judge": False}
    judge = [m.text for m in episode.traces["judge"].messages]
    assert "[debater_a] A1" in judge and "[debater_b] B2" in judge and not any("hmm" in t for t in judge)
    b_view = [m.text for m in episode.traces["debater_b"].messages]
    assert b_view.index("B1") < b_view.index("[debater_a] A1")  # a's round-1 argument reached b only after round 1


async def test_an_unreadable_verdict_is_an_episode_error_not_a_reward_of_zero():
    taskset = load_taskset("debate", {"rounds": 1})
    episodes = await evaluate_episodes(taskset, by_member(debater_a=["x"] * 2, debater_b=["y"] * 2,
                                                          judge=["I cannot decide.", "VERDICT: Q"]), num_tasks=2)
    for episode in episodes:
        assert episode.error is not None and episode.error.stage == "act:judge"
        assert "must be one of" in episode.error.message and episode.rewards == dict.fromkeys(episode.members)
        assert episode.stop_reason == tg.StopReason.ERROR


def test_the_shipped_questions_are_well_formed():
    rows = list(load_taskset("debate"))
    assert len(rows) >= 30 and all(r.answer in r.sides.values() and len(set(r.sides.values())) == 2 for r in rows)


async def test_random_tictactoe_players_only_ever_mark_free_cells():
    taskset = load_taskset("tictactoe", {"num_tasks": 6})
    seats = {"player_x": tg.Seat(script="random"), "player_o": tg.Seat(script="random")}
    episodes = await evaluate_episodes(taskset, ScriptedModel(rule=lambda r: "unused"), rollouts=2, seats=seats)
    assert all(e.ok and e.outcomes and e.metrics["invalid_moves"] == 0 for e in episodes)
