"""A tool result longer than the task's `tool_result_limit` (a 70k-token one, say) is cut there with a note, or
refused as a tool error, as `tool_result_over` says: never passed on whole, never a crash."""

import asyncio

import tracegym as tg
from tracegym.core.messages import TextPart
from tracegym.envs.rollout import TOOL_RESULTS_CUT
from tracegym.testing import ScriptedModel, reply, tool_call
from tracegym.testing.images import image_part, png

HUGE = "word " * 70_000
"""About 70k tokens of tool output (350,000 characters)."""


def dump(path: str) -> str:
    """Print a file.

    Args:
        path: the file.
    """
    return HUGE


@tg.reward
def answered(task, trace):
    return float(trace.last_reply == "done")


class Cuts(tg.Task):
    tool_result_limit = 1_000


class Refuses(tg.Task):
    tool_result_limit = 1_000
    tool_result_over = "refuse"


def rollout(task_class: type[tg.Task], tool=dump) -> tuple[tg.Trace, ScriptedModel]:
    class Dumps(tg.Taskset):
        id = "dumps"

    Dumps.task_class = task_class
    taskset = Dumps(data=[{"prompt": "show me"}], rewards=[answered], tools=[tool])
    model = ScriptedModel([reply(None, tool_call(tool.__name__, {"path": "/var/log/big"})), "done"], tokens=True)
    [data] = list(taskset)
    return asyncio.run(tg.run_rollout(taskset, data, model)), model


def tool_message(model: ScriptedModel) -> str:
    return model.requests[-1].messages[-1].text


def test_a_result_over_the_limit_is_cut_there_with_a_note_and_counted():
    trace, model = rollout(Cuts)
    shown = tool_message(model)
    assert shown.startswith(HUGE[:1_000]) and shown.endswith("[... 349,000 more characters cut: the tool result "
                                                             "limit is 1,000]")
    assert trace.metrics[TOOL_RESULTS_CUT] == 1 and trace.ok and trace.reward == 1.0


def test_a_result_over_the_limit_can_be_refused_as_a_tool_error_the_model_is_told_of():
    trace, model = rollout(Refuses)
    assert tool_message(model) == ("Error: ValueError: the result of tool 'dump' has 350,000 characters, more than "
                                   "this task's tool_result_limit of 1,000: refused")
    assert [(e.kind, e.stage) for e in trace.errors] == [(tg.ErrorKind.TOOL, "tool:dump")]
    assert trace.ok and trace.failure is None  # the model was told and went on: the rollout trains


def test_the_default_limit_cuts_a_70k_token_result():
    trace, model = rollout(tg.Task)
    assert len(tool_message(model)) < 100_100 and trace.metrics[TOOL_RESULTS_CUT] == 1


def test_a_result_within_the_limit_is_passed_on_whole():
    class Roomy(tg.Task):
        tool_result_limit = None

    trace, model = rollout(Roomy)
    assert tool_message(model) == HUGE and TOOL_RESULTS_CUT not in trace.metrics


IMAGE = image_part(png())  # a real picture: one the model could not read would be refused before the call


def screenshot(path: str) -> list:
    """A page's text and a picture of it.

    Args:
        path: the page.
    """
    return [TextPart(text=HUGE), IMAGE]


def test_a_cut_result_with_images_keeps_them():
    trace, model = rollout(Cuts, screenshot)
    text, *rest = model.requests[-1].messages[-1].content
    assert len(text.text) < 1_100 and rest == [IMAGE] and trace.metrics[TOOL_RESULTS_CUT] == 1
