"""Judge rewards against a fake judge server: the prompt it renders, the verdict it reads, its cache, the call it
records on the trace, and a failure that is an error of kind `judge`, never a 0."""

import re

import pytest

import tracegym as tg
from tracegym.core.errors import FailureKind
from tracegym.envs.judge import fresh_verdicts
from tracegym.testing import Fail, FakeOpenAIServer, ScriptedModel

TASKS = [{"prompt": "What is 2+2?", "answer": "4", "id": "sum"}]


def judge_of(server, **options):
    endpoint = tg.Endpoint(base_url=server.base_url, model=server.model, max_retries=0, api_key_env=None)
    return tg.Judge(endpoint, **options)


def grading(request):
    """A judge that says yes when the response holds the reference answer (read back from the prompt)."""
    prompt = request.messages[-1].text
    reference = re.search(r"Reference answer:\n(.*)\n", prompt).group(1)
    response = prompt.rsplit("Response:\n", 1)[1].split("\n\n")[0]
    return f"Thinking it over.\nVERDICT: {'yes' if reference in response else 'no'}"


async def test_a_judge_reward_scores_the_verdict_and_records_its_call_on_the_trace():
    with FakeOpenAIServer(rule=grading) as server:
        judge = judge_of(server)
        ts = tg.Taskset(id="judged", data=TASKS, rewards=[judge])
        model = ScriptedModel(rule=lambda request: ["It is 4.", "It is 5."][request.sampling.seed])
        [right, wrong] = await tg.run_group(ts, ts[0], model, rollouts=2, sampling=tg.Sampling(seed=0))
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    [call] = right.judgments
    assert (call.judge, call.model, call.score, call.cached) == ("judge", "fake-model", 1.0, False)
    assert "Question:\nWhat is 2+2?" in call.prompt and "Response:\nIt is 4." in call.prompt
    assert call.reply.endswith("VERDICT: yes")
    assert server.requests[0]["temperature"] == 0.0


async def test_the_same_answer_to_the_same_task_is_judged_once():
    with FakeOpenAIServer(rule=grading) as server:
        judge = judge_of(server)
        ts = tg.Taskset(id="judged", data=TASKS, rewards=[judge])
        traces = await tg.run_group(ts, ts[0], ScriptedModel(["4"] * 4), rollouts=4)
        again = await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
    assert len(server.requests) == 1 and judge.calls == 1
    assert [t.reward for t in [*traces, again]] == [1.0] * 5
    assert again.judgments[0].cached


async def test_fresh_verdicts_ask_the_judge_again_instead_of_its_cache():
    with FakeOpenAIServer(rule=grading) as server:
        judge = judge_of(server)
        ts = tg.Taskset(id="judged", data=TASKS, rewards=[judge])
        await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
        with fresh_verdicts():
            trace = await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
    assert len(server.requests) == 2 and not trace.judgments[0].cached


async def test_a_reply_without_a_verdict_is_a_judge_error_never_a_zero():
    with FakeOpenAIServer(["I cannot decide."]) as server:
        ts = tg.Taskset(id="judged", data=TASKS, rewards=[judge_of(server)])
        trace = await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
    assert trace.rewards["judge"].score is None and trace.reward is None
    [error] = trace.errors
    assert (error.kind, error.failure, error.stage) == (tg.ErrorKind.JUDGE, FailureKind.JUDGE_ERROR, "scoring:judge")
    assert error.message == "judge 'judge' gave no 'VERDICT: ...' line; a verdict must be one of yes, no"
    assert trace.failure == FailureKind.JUDGE_ERROR
    assert (trace.judgments[0].reply, trace.judgments[0].score) == ("I cannot decide.", None)


async def test_a_judge_endpoint_that_fails_is_a_judge_error_naming_it():
    with FakeOpenAIServer([Fail(503, "overloaded")]) as server:
        ts = tg.Taskset(id="judged", data=TASKS, rewards=[judge_of(server)])
        trace = await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
    [error] = trace.errors
    assert error.kind == tg.ErrorKind.JUDGE and trace.rewards["judge"].score is None
    assert error.message.startswith(f"judge 'judge': model 'fake-model' at {server.base_url} failed:")
    assert trace.judgments[0].reply is None


async def test_a_failed_verdict_is_not_cached():
    replies = iter(["no verdict here", "VERDICT: yes"])
    with FakeOpenAIServer(rule=lambda request: next(replies)) as server:
        judge = judge_of(server)
        ts = tg.Taskset(id="judged", data=TASKS, rewards=[judge])
        first = await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
        second = await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
    assert (first.reward, second.reward) == (None, 1.0) and judge.calls == 2


async def test_a_judge_with_its_own_template_verdicts_and_weight():
    with FakeOpenAIServer(rule=lambda r: "VERDICT: B" if "Paris" in r.messages[-1].text else "VERDICT: C") as server:
        judge = judge_of(server, prompt="{question} -> {response} (difficulty {level})", name="grade", weight=0.5,
                         verdicts={"A": 1.0, "B": 0.5, "C": 0.0})
        ts = tg.Taskset(id="judged", data=[{"prompt": "Capital of France?", "level": "easy"}], rewards=[judge])
        trace = await tg.run_rollout(ts, ts[0], ScriptedModel(["Paris"]))
    assert server.requests[0]["messages"][-1]["content"] == "Capital of France? -> Paris (difficulty easy)"
    assert trace.rewards["grade"].score == 0.5 and trace.reward == 0.25


async def test_a_judge_parse_function_reads_a_numeric_score():
    with FakeOpenAIServer(["Score: 7/10"]) as server:
        judge = judge_of(server, parse=lambda reply: int(re.search(r"(\d+)/10", reply).group(1)) / 10)
        ts = tg.Taskset(id="judged", data=TASKS, rewards=[judge])
        trace = await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
    assert trace.reward == 0.7


async def test_a_template_naming_a_field_the_task_lacks_is_a_judge_error_naming_it():
    with FakeOpenAIServer(["VERDICT: yes"]) as server:
        ts = tg.Taskset(id="judged", data=TASKS, rewards=[judge_of(server, prompt="{question} {rubric}")])
        trace = await tg.run_rollout(ts, ts[0], ScriptedModel(["4"]))
    assert trace.errors[0].kind == tg.ErrorKind.JUDGE and server.requests == []
    assert trace.errors[0].message.startswith("judge 'judge': its prompt names {rubric}, which task 'sum' has no field")


def test_a_template_that_does_not_parse_is_refused_when_the_judge_is_made():
    endpoint = tg.Endpoint(base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(tg.UsageError, match="judge 'judge': its prompt is not a valid template"):
        tg.Judge(endpoint, prompt="{question")
    with pytest.raises(tg.UsageError, match=r"judge 'judge': its prompt names \{0\}"):
        tg.Judge(endpoint, prompt="{0}")
