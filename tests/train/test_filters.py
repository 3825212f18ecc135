"""Rollout filters on hand-built traces: gibberish (runs of unlikely sampled tokens) and repetition (a unit
repeated back to back), `detect` vs `enforce`, the per-environment rates and the trace marks, unknown names as a
config error; and in the orchestrator: a caught rollout is saved but not trained, in an episode only its member."""

import asyncio
import doctest
import json
import random

import pytest

from tracegym.cli.main import main
from tracegym.core.episode import Episode
from tracegym.core.messages import assistant, user
from tracegym.core.task_data import TaskData
from tracegym.core.trace import RewardScore, StopReason, Trace
from tracegym.serve.local_server import local_server
from tracegym.testing import make_episode
from tracegym.train import filters
from tracegym.train.filters import Filters, Gibberish, Repetition, drops_by_env, screen
from tracegym.train.orchestrator import Orchestrator
from tracegym.train.rl_config import RLConfig
from tracegym.train.rl_folder import Endpoints, RLFolder
from tracegym.train.roles import orchestrator_for

UNLIKELY = -20.0


def tokened(*turns: list[int] | tuple[list[int], list[float] | None], reward: float = 1.0,
            task: TaskData | None = None, taskset: str = "reverse-text") -> Trace:
    """A trace with one sampled turn per entry (ids, with logprobs -0.1 each unless given), a user turn between."""
    trace = Trace(task=task or TaskData(prompt="q"), taskset=taskset, stop_reason=StopReason.COMPLETED)
    trace.graph.add(user("q"))
    trace.prompt_length = 1
    prompt = [1, 2]
    for turn in turns:
        ids, logprobs = turn if isinstance(turn, tuple) else (turn, [-0.1] * len(turn))
        trace.graph.add_model_turn(assistant("a"), prompt_ids=list(prompt), completion_ids=ids,
                                   completion_logprobs=logprobs, temperature=1.0)
        prompt += [*ids, 3]
        trace.graph.add(user("again"))
    trace.rewards["reward"] = RewardScore(score=reward)
    return trace


def gibberish(reward: float = 0.0, **fields) -> Trace:
    return tokened(([5, 6, 7, 8], [-0.1, UNLIKELY, UNLIKELY, -0.1]), reward=reward, **fields)


def loop(reward: float = 0.0, **fields) -> Trace:
    return tokened([10, 11, 12] * 12, reward=reward, **fields)


# --- gibberish ---------------------------------------------------------------------------------------------------
def test_gibberish_catches_a_run_of_unlikely_tokens_not_a_lone_one():
    assert Gibberish(run=2).catches(gibberish())
    lone = tokened(([5, 6, 7], [UNLIKELY, -0.1, UNLIKELY]))
    assert not Gibberish(run=2).catches(lone) and Gibberish().catches(lone)  # prime-rl's default: any one
    assert not Gibberish(logprob_below=-25.0).catches(gibberish())
    assert not Gibberish().catches(tokened([5, 6, 7]))


def test_gibberish_counts_only_rare_tokens_when_asked_and_never_the_prompt():
    assert not Gibberish(min_token_id=7, run=2).catches(gibberish())  # token 6 of the run is below the id
    assert Gibberish(min_token_id=7).catches(gibberish()) and not Gibberish(min_token_id=8).catches(gibberish())
    # the prompt tokens on a model node carry logprob 0.0 (not sampled): a run there is not looked at
    assert not Gibberish(logprob_below=0.5, run=3).catches(tokened([9]))


def test_a_gibberish_run_does_not_span_two_turns_and_a_turn_without_logprobs_is_not_checked():
    split = tokened(([5, 6], [-0.1, UNLIKELY]), ([7, 8], [UNLIKELY, -0.1]))
    assert not Gibberish(run=2).catches(split)
    assert not Gibberish(run=1).catches(tokened(([5, 6], None)))


# --- repetition --------------------------------------------------------------------------------------------------
def test_repetition_catches_a_unit_repeated_back_to_back_anywhere_in_a_turn():
    assert Repetition().catches(loop())
    assert Repetition().loop_length([10, 11, 12] * 12) == 36
    assert Repetition().catches(tokened([1, 2, 3, 4, 5] + [9] * 12))  # `the the the ...` after a start
    assert Repetition().catches(tokened([4, 5] + list(range(40, 47)) * 4 + [3]))  # a 7-token sentence, 4 times
    assert not Repetition().catches(tokened([1, 2, 3, 4, 5] + [9] * 11))


def test_repetition_needs_enough_repeats_over_enough_tokens():
    assert not Repetition().catches(tokened(list(range(100, 160))))  # no unit repeats
    assert not Repetition().catches(tokened([7, 0, 0, 0, 0, 0, 8]))  # `00000` in a number: under min_tokens
    assert not Repetition().catches(tokened(list(range(20, 40)) * 3))  # 3 repeats, 4 needed
    assert Repetition(min_repeats=3).catches(tokened(list(range(20, 40)) * 3))
    assert not Repetition(max_period=19).catches(tokened(list(range(20, 40)) * 4))  # the unit is 20 long


def brute_loop_length(ids: list[int], rule: Repetition) -> int:
    """The definition, checked at every position: the first maximal run of ids[i] == ids[i - p] long enough."""
    for period in range(1, min(rule.max_period, len(ids) // rule.min_repeats) + 1):
        need, run = max(rule.min_tokens, period * rule.min_repeats) - period, 0
        for i in range(period, len(ids) + 1):
            if i < len(ids) and ids[i] == ids[i - period]:
                run += 1
            elif run >= need:
                return run + period
            else:
                run = 0
    return -1


def test_the_anchored_search_finds_what_checking_every_position_finds():
    rng = random.Random(0)
    found = 0
    for _ in range(3000):
        rule = Repetition(max_period=rng.randint(1, 8), min_repeats=rng.randint(2, 5), min_tokens=rng.randint(1, 16))
        ids = [rng.randrange(rng.randint(1, 4)) for _ in range(rng.randint(0, 60))]
        assert rule.loop_length(ids) == brute_loop_length(ids, rule), (rule, ids)
        found += rule.loop_length(ids) > 0
    assert 300 < found < 2700  # both outcomes well exercised


def test_repetition_looks_within_each_turn():
    assert not Repetition().catches(tokened(*[[10, 11, 12]] * 12))  # the same short reply each turn
    assert Repetition().catches(tokened([1, 2], [10, 11, 12] * 12))


# --- detect, enforce, metrics, marks ---------------------------------------------------------------------------
def test_detect_counts_and_marks_enforce_also_drops():
    caught, clean = gibberish(), tokened([5, 6])
    screening = screen([Gibberish(mode="detect")], [("reverse-text", caught), ("reverse-text", clean)])
    assert screening.dropped == set() and screening.keeps(caught)
    assert caught.metrics == {"filter/gibberish": 1.0} and clean.metrics == {}
    enforced = screen([Gibberish(mode="enforce")], [("reverse-text", caught), ("reverse-text", clean)])
    assert enforced.dropped == {caught.id} and not enforced.keeps(caught) and enforced.keeps(clean)
    assert caught.metrics == {"filter/gibberish": 1.0, "filter/dropped": 1.0}


def test_every_filter_checks_every_rollout_and_rates_are_per_environment_and_over_all():
    both = tokened(([5, 6], [UNLIKELY, UNLIKELY]), [10, 11, 12] * 12)
    traces = [("reverse-text", both), ("reverse-text", tokened([5])), ("reverse-text", loop()),
              ("org/env:v1", gibberish()), ("org/env:v1", tokened([5]))]
    screening = screen([Gibberish(mode="enforce"), Repetition(mode="detect")], traces)
    assert screening.metrics() == {
        "rollouts_filtered": 2,
        "filters/org/env:v1/gibberish": 0.5, "filters/org/env:v1/repetition": 0.0,
        "filters/org/env:v1/dropped": 0.5, "filters/org/env:v1/checked": 2,
        "filters/reverse-text/gibberish": 1 / 3, "filters/reverse-text/repetition": 2 / 3,
        "filters/reverse-text/dropped": 1 / 3, "filters/reverse-text/checked": 3,
        "filters/all/gibberish": 0.4, "filters/all/repetition": 0.4, "filters/all/dropped": 0.4,
        "filters/all/checked": 5}
    assert both.metrics == {"filter/gibberish": 1.0, "filter/repetition": 1.0, "filter/dropped": 1.0}
    assert drops_by_env([screening.metrics(), screening.metrics()]) == (
        "org/env:v1: 2 of 4, caught by gibberish 2 and repetition 0; "
        "reverse-text: 2 of 6, caught by gibberish 2 and repetition 4")


def test_no_filter_makes_no_rates():
    assert screen([], [("reverse-text", gibberish())]).metrics() == {"rollouts_filtered": 0}
    assert Filters(gibberish=Gibberish(mode="off")).active() == [Repetition()]


def test_the_modules_doctest_runs():
    assert doctest.testmod(filters).failed == 0


# --- config ------------------------------------------------------------------------------------------------------
def test_both_filters_count_by_default_and_a_section_sets_one():
    assert [(f.name, f.mode) for f in RLConfig.model_validate({"trainer": {}}).orchestrator.filters.active()] == [
        ("gibberish", "detect"), ("repetition", "detect")]
    config = RLConfig.model_validate({"trainer": {}, "orchestrator": {"filters": {
        "repetition": {"mode": "enforce", "min_repeats": 3}}}})
    assert config.orchestrator.filters.repetition == Repetition(mode="enforce", min_repeats=3)


@pytest.mark.parametrize(("toml", "named"), [
    ('[orchestrator.filters.gibbrish]\nmode = "enforce"\n', "[orchestrator.filters] gibbrish: unknown key"),
    ('[orchestrator.filters.gibberish]\nmode = "enforced"\n', "[orchestrator.filters.gibberish] mode: "),
    ('[orchestrator.filters.repetition]\nwindow = 3000\n', "[orchestrator.filters.repetition] window: unknown key"),
    ('[orchestrator]\nbatch_attempts = 0\n', "[orchestrator] batch_attempts: "),
])
def test_an_unknown_filter_or_a_bad_threshold_exits_2_with_one_line_naming_the_key(tmp_path, capsys, toml, named):
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    assert main(["rl", "@", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err


# --- in the orchestrator ------------------------------------------------------------------------------------------
class FakeGroups:
    """Answers a single-agent group's `episodes` without a model: each group is the next scripted list of trace
    makers, each rollout its solo episode (rewards 1 and 0 alternate, so every group has signal unless a filter
    empties it)."""

    def __init__(self, *groups: list) -> None:
        self.groups = list(groups)

    async def episodes(self, served, data, endpoint, indices, *, seats=None, sampling=None):
        assert seats is None  # a single-agent environment's members all play the policy
        makers = self.groups.pop(0)
        return [Episode.solo(make(reward=float(i % 2), task=data)) for i, make in enumerate(makers)]

    async def aclose(self) -> None:
        pass


def clean(reward: float = 0.0, **fields) -> Trace:
    return tokened([5, 6, 7], reward=reward, **fields)


def orchestrator(tmp_path, endpoints, client, **orch) -> Orchestrator:
    config = RLConfig.model_validate({
        "trainer": {"model": "unused"}, "model": {"client": "chat"},
        "orchestrator": {"tasks_per_step": 1, "group_size": 4, **orch}})
    built = orchestrator_for(config, RLFolder(tmp_path), endpoints)
    built.envs["reverse-text"].client = client
    return built


def test_an_enforced_catch_is_saved_and_marked_but_not_trained(tmp_path, endpoints):
    orch = orchestrator(tmp_path, endpoints, FakeGroups([clean, clean, gibberish, loop]),
                        filters={"gibberish": {"mode": "enforce"}})
    samples, metrics = asyncio.run(orch.collect(0, 0, "base"))
    saved = [json.loads(line) for line in (tmp_path / "traces" / "step-000000.jsonl").read_text().splitlines()]
    assert len(saved) == 4
    dropped = [t["id"] for t in saved if t["metrics"].get("filter/dropped")]
    assert len(dropped) == 1 and saved[2]["metrics"] == {"filter/gibberish": 1.0, "filter/dropped": 1.0}
    assert saved[3]["metrics"] == {"filter/repetition": 1.0}  # counted only: trained
    assert {s.trace_id for s in samples} == {saved[i]["id"] for i in (0, 1, 3)}
    # its reward still counts in the group's baseline (mean 0.5), as prime-rl keeps it
    assert sorted(s.advantage for s in samples) == [-0.5, 0.5, 0.5]
    assert metrics["filters/reverse-text/gibberish"] == 0.25 and metrics["filters/all/repetition"] == 0.25
    assert metrics["rollouts_filtered"] == 1


def test_in_an_episode_an_enforced_catch_drops_that_members_unit_alone(tmp_path):
    class GibberishPlayer:
        """Plays each episode with player_0's turn gibberish; player_1 plays cleanly."""

        async def episodes(self, served, data, endpoint, indices, *, seats=None, sampling=None):
            return [self.episode(data, i) for i in indices]

        def episode(self, data, episode_index):
            rewards = {"player_0": 1.0, "player_1": -1.0} if episode_index % 2 else {"player_0": -1.0,
                                                                                    "player_1": 1.0}
            episode = make_episode(rewards, task=data, taskset="kuhn-poker", episode_index=episode_index)
            member = episode.traces["player_0"]
            node = member.graph.nodes[-1]
            member.graph.nodes[-1] = node.model_copy(update={"logprobs": [0.0] * 3 + [UNLIKELY] * 2})
            return episode

        async def aclose(self) -> None:
            pass

    config = RLConfig.model_validate({
        "trainer": {"model": "unused"}, "weight_sync": "lora",
        "orchestrator": {"tasks_per_step": 1, "group_size": 2, "advantage": "group_mean",
                         "filters": {"gibberish": {"mode": "enforce"}},
                         "train": {"envs": [{"id": "kuhn-poker", "options": {"num_tasks": 5}}]}}})
    with local_server("kuhn-poker", {"num_tasks": 5}, workers=1) as address:
        endpoints = Endpoints(base_url="http://127.0.0.1:9/v1", base_model="base", envs={"kuhn-poker": address})
        orch = orchestrator_for(config, RLFolder(tmp_path), endpoints)
    orch.envs["kuhn-poker"].client = GibberishPlayer()
    samples, metrics = asyncio.run(orch.collect(0, 0, "base"))
    episodes = RLFolder(tmp_path).step_log(0).read().episodes
    trained = {s.trace_id for s in samples}
    assert trained == {e.traces["player_1"].id for e in episodes}
    assert all(e.traces["player_0"].metrics == {"filter/gibberish": 1.0, "filter/dropped": 1.0} for e in episodes)
    assert metrics["filters/kuhn-poker/dropped"] == 0.5 and metrics["rollouts_filtered"] == 2
