"""Episode view: members side by side, each its own view, private reasoning marked and never in another's
column, rewards, outcomes, the verdict, parse errors and episode errors."""

from detail_traces import SCRIPT, debate_episode, poker_episode, text_of, tree

from tracegym.view.episode_view import episode_html


def columns(html: str) -> dict:
    return {d.get("data-member"): d for d in tree(html).iter("div") if d.get("class") == "member"}


def private_text(element) -> str:
    return "".join(text_of(s) for s in element.iter() if "private" in (s.get("class") or "").split())


async def test_debate_members_side_by_side_with_private_reasoning_only_in_its_own_column():
    episode = await debate_episode()
    html = episode_html(episode, {})
    shown = columns(html)
    assert list(shown) == ["debater_a", "debater_b", "judge"]
    assert "secret plan" in private_text(shown["debater_a"])
    for other in ("debater_b", "judge"):
        assert "secret plan" not in text_of(shown[other])
    said = [d for d in shown["judge"].iter("div") if d.get("data-from") == "debater_a"]
    assert len(said) == 1 and text_of(said[0]).endswith("[debater_a] A is right")  # a's public output, attributed
    assert "<script" not in html and SCRIPT in private_text(shown["debater_a"])


async def test_rewards_outcomes_and_the_judges_verdict_are_shown():
    episode = await debate_episode()
    root = tree(episode_html(episode, {}))
    rows = {r.get("data-member"): [text_of(td) for td in r.iter("td")] for r in root.iter("tr") if r.get("data-member")}
    winner = next(m for m, o in episode.outcomes.items() if o.value == "win")
    assert rows[winner][3:5] == ["1.000", "win"] and rows["judge"][2:5] == ["no", "1.000", "—"]
    [verdict] = [d for d in root.iter("div") if d.get("class") == "verdict"]
    assert verdict.get("data-member") == "judge" and f"VERDICT: {episode.task.answer}" in text_of(verdict)


async def test_an_unreadable_verdict_is_shown_as_the_episodes_error():
    episode = await debate_episode(judge="I cannot decide.")
    root = tree(episode_html(episode, {}))
    [error] = [d for d in root.iter("div") if d.get("class") == "episode-error"]
    assert "act:judge" in text_of(error) and "must be one of" in text_of(error)
    assert not [d for d in root.iter("div") if d.get("class") == "verdict"]


async def test_poker_parse_errors_are_flagged_and_traces_given_apart_are_used():
    episode = await poker_episode()
    traces, episode.traces = dict(episode.traces), {}  # as a reader that keeps traces apart from the record
    html = episode_html(episode, {"player_0": traces["player_0"]})
    shown = columns(html)
    flagged = [d for d in shown["player_0"].iter("div") if d.get("data-parse-error")]
    assert len(flagged) == 1 and "they fold" in private_text(flagged[0])
    assert "No trace recorded" in text_of(shown["player_1"])
    rows = {r.get("data-member"): [text_of(td) for td in r.iter("td")] for r in tree(html).iter("tr")
            if r.get("data-member")}
    assert rows["player_0"][3:5] == ["2.000", "win"] and rows["player_1"][3:5] == ["-2.000", "loss"]  # bet, call
