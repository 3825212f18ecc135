"""Slow: a judge reward whose judge is the embedded model served by a real vLLM: its replies are read, recorded on
the traces and cached, a group's identical answers costing one call."""

import pytest

import tracegym as tg
from tracegym.models.launch import serve
from tracegym.models.model_choice import ModelChoice
from tracegym.testing import ScriptedModel

pytestmark = pytest.mark.slow


def said_yes(reply: str) -> float:
    """A lenient verdict for a 135M-parameter judge: any reply that says yes."""
    return float("yes" in reply.lower())


async def test_a_judge_on_the_embedded_vllm_model_scores_and_records_each_call(tmp_path):
    with serve(ModelChoice(), log_path=tmp_path / "vllm.log") as endpoint:
        judge = tg.Judge(endpoint, parse=said_yes, sampling=tg.Sampling(temperature=0.0, max_tokens=16))
        taskset = tg.Taskset(id="judged", data=[{"prompt": "What is 2+2?", "answer": "4"}], rewards=[judge])
        model = ScriptedModel(rule=lambda request: ["4", "4", "five"][request.sampling.seed])
        traces = await tg.run_group(taskset, taskset[0], model, 3, sampling=tg.Sampling(seed=0))
    calls = [t.judgments for t in traces]
    assert all(len(c) == 1 and c[0].reply for c in calls), calls
    assert [t.reward for t in traces] == [said_yes(c[0].reply) for c in calls]
    assert judge.calls == 2 and sorted(c[0].cached for c in calls) == [False, False, True]
    assert calls[0][0].model == endpoint.model and calls[0][0].reply == calls[1][0].reply
