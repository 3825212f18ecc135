"""A verifiers environment module runs unmodified as a taskset: its dataset rows are the tasks, its own rollout
drives each rollout with the model calls on the trace (exact tokens), its rubric's functions are the rewards and
metrics; what tracegym cannot run is refused by name at load."""

import pytest
from verifiers_envs import (
    FAILING_REWARD,
    FINAL_WORD,
    GROUP_REWARD,
    MULTI_TURN,
    RAISING_ENV_RESPONSE,
    SINGLE_TURN,
    TOOLS,
)

from tracegym.core.errors import ErrorKind, UsageError
from tracegym.core.sampling import Sampling
from tracegym.core.trace import StopReason
from tracegym.envs.registry import load_taskset
from tracegym.envs.rollout import rollout
from tracegym.testing import Fail, ScriptedModel, Stall, reply, tool_call

pytest.importorskip("verifiers")


def env_file(tmp_path, source: str, name: str = "env.py") -> str:
    path = tmp_path / name
    path.write_text(source)
    return str(path)


async def run_first(taskset, model):
    task = taskset.task(next(iter(taskset)))
    return task, await rollout(task, model, Sampling(max_tokens=32))


def test_the_datasets_rows_are_the_tasks_keyed_by_example_id(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, SINGLE_TURN)}")
    rows = list(taskset)
    assert [r.key for r in rows] == ["0", "1", "2"]
    assert [m.text for m in rows[1].prompt] == ["Answer in one word.", "Say pear"]
    assert rows[1].answer == "pear"


def test_env_args_reach_load_environment(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, SINGLE_TURN)}", {"env_args": {"words": ["fig"]}})
    assert [r.answer for r in taskset] == ["fig"]


async def test_a_single_turn_environment_is_scored_by_its_rubric(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, SINGLE_TURN)}")
    _, trace = await run_first(taskset, ScriptedModel(["apple"], tokens=True))
    assert trace.stop_reason == StopReason.COMPLETED and not trace.errors
    assert trace.rewards["exact"].score == 1.0 and trace.reward == 1.0
    assert trace.metrics["length"] == 5.0 and trace.metrics["num_turns"] == 1.0


async def test_the_model_call_lands_in_the_graph_with_exact_tokens(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, SINGLE_TURN)}")
    _, trace = await run_first(taskset, ScriptedModel(["apple"], tokens=True))
    assert [(n.message.role, n.message.text) for n in trace.graph.nodes] == [
        ("system", "Answer in one word."), ("user", "Say apple"), ("assistant", "apple")]
    last = trace.graph.nodes[-1]
    assert last.sampled and bytes(t for t, m in zip(last.token_ids, last.mask, strict=True) if m) == b"apple<|end|>\n"
    assert last.logprobs is not None


async def test_a_multi_turn_environment_answers_each_turn_and_ends_on_its_stop_condition(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, MULTI_TURN)}")
    _, trace = await run_first(taskset, ScriptedModel(["3", "9", "7"], tokens=True))
    assert trace.stop_reason == StopReason.STOP_CONDITION and trace.stopped_by == "found"
    assert [n.message.text for n in trace.graph.nodes if n.message.role != "system"] == [
        "Guess my number (1-9).", "3", "higher", "9", "lower", "7"]
    assert trace.rewards["solved"].score == 1.0
    assert trace.metrics["guesses"] == 2.0 and trace.metrics["num_turns"] == 3.0


async def test_a_multi_turn_environment_out_of_turns_ends_at_max_turns(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, MULTI_TURN)}", {"env_args": {"max_turns": 2}})
    _, trace = await run_first(taskset, ScriptedModel(["1", "2"], tokens=True))
    assert trace.stop_reason == StopReason.MAX_TURNS
    assert trace.rewards["solved"].score == 0.0


async def test_a_tool_environment_runs_its_tools_and_counts_them(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, TOOLS)}")
    model = ScriptedModel([reply(None, tool_call("add", {"a": 2, "b": 3})), "It is 5."], tokens=True)
    _, trace = await run_first(taskset, model)
    assert trace.stop_reason == StopReason.COMPLETED and not trace.errors
    tool_messages = [n.message for n in trace.graph.nodes if n.message.role == "tool"]
    assert [m.text for m in tool_messages] == ["5"]
    assert model.requests[0].tools[0].name == "add"
    assert trace.rewards["correct"].score == 1.0
    assert trace.metrics["total_tool_calls"] == 1.0 and trace.metrics["add_calls"] == 1.0


async def test_a_reward_function_that_raises_scores_none_with_an_error_not_zero(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, FAILING_REWARD)}")
    _, trace = await run_first(taskset, ScriptedModel(["hi"]))
    assert trace.rewards["broken"].score is None and trace.rewards["fine"].score == 1.0
    assert [(e.stage, e.kind) for e in trace.errors] == [("scoring:broken", ErrorKind.TASK)]
    assert "no verdict" in trace.errors[0].message


async def test_a_failed_model_call_ends_the_rollout_as_an_error_at_the_model_stage(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, MULTI_TURN)}")
    _, trace = await run_first(taskset, ScriptedModel(["3", Fail(503)]))
    assert trace.stop_reason == StopReason.ERROR
    assert [e.stage for e in trace.errors] == ["model"]
    assert trace.rewards["solved"].score is None


def test_a_group_reward_function_is_refused_at_load_by_name(tmp_path):
    with pytest.raises(UsageError, match="'best_of_group' scores a whole group"):
        load_taskset(f"verifiers:{env_file(tmp_path, GROUP_REWARD)}")


def test_a_module_without_load_environment_is_refused_naming_its_file(tmp_path):
    path = env_file(tmp_path, "X = 1\n", "nothing_here.py")
    with pytest.raises(UsageError, match=r"nothing_here\.py' has no load_environment\(\)"):
        load_taskset(f"verifiers:{path}")


def test_a_module_that_fails_to_import_is_refused_naming_its_file(tmp_path):
    path = env_file(tmp_path, "import verifiers\nraise RuntimeError('boom')\n", "broken_env.py")
    with pytest.raises(UsageError, match=r"broken_env\.py' failed to import: RuntimeError: boom"):
        load_taskset(f"verifiers:{path}")


def test_a_module_that_is_not_installed_is_refused_naming_it():
    with pytest.raises(UsageError, match="no module named 'no_such_vf_env' is installed"):
        load_taskset("verifiers:no-such-vf-env")


def test_load_environment_failing_is_refused_naming_the_module(tmp_path):
    path = env_file(tmp_path, "def load_environment(**kw):\n    raise KeyError('api key')\n", "needs_key.py")
    with pytest.raises(UsageError, match=r"needs_key\.py': load_environment\(\) failed: KeyError"):
        load_taskset(f"verifiers:{path}")


async def test_an_environment_response_that_raises_ends_the_rollout_as_a_task_error_at_program(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, RAISING_ENV_RESPONSE)}")
    _, trace = await run_first(taskset, ScriptedModel(["a", "b"]))
    assert trace.stop_reason == StopReason.ERROR
    assert [(e.stage, e.kind) for e in trace.errors] == [("program", ErrorKind.TASK)]
    assert "the board is gone" in trace.errors[0].message


async def test_the_environments_own_timeout_ends_the_rollout_as_a_timeout(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, RAISING_ENV_RESPONSE)}",
                           {"env_args": {"timeout_seconds": 0.5}})
    _, trace = await run_first(taskset, ScriptedModel([Stall(None)]))
    assert trace.stop_reason == StopReason.TIMEOUT
    assert [(e.stage, e.kind) for e in trace.errors] == [("program", ErrorKind.TIMEOUT)]
    assert "timeout_seconds (0.5 s)" in trace.errors[0].message


async def test_an_empty_reply_verifiers_refuses_is_the_models_own_output_scored_and_counted(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, SINGLE_TURN)}")
    _, trace = await run_first(taskset, ScriptedModel([""]))
    assert trace.stop_reason == StopReason.COMPLETED and trace.metrics["invalid_replies"] == 1
    # verifiers leaves the completion empty; a reward that cannot read it fails on its own (verifiers would say 0)
    assert [e.stage for e in trace.errors] == ["scoring:exact", "scoring:length"] and trace.metrics["length"] is None


@pytest.mark.parametrize("spec", ["my-vf-words", "someone/my-vf-words", "someone/my-vf-words@0.1.0"])
def test_an_installed_module_is_found_by_its_hub_id(spec, tmp_path, monkeypatch):
    (tmp_path / "my_vf_words.py").write_text(SINGLE_TURN)
    monkeypatch.syspath_prepend(str(tmp_path))
    taskset = load_taskset(f"verifiers:{spec}")
    assert taskset.id == f"verifiers:{spec}" and len(taskset) == 3


async def test_the_environments_final_word_ends_the_trace_and_is_what_the_rubric_read(tmp_path):
    taskset = load_taskset(f"verifiers:{env_file(tmp_path, FINAL_WORD)}")
    _, trace = await run_first(taskset, ScriptedModel(["4"], tokens=True))
    assert trace.stop_reason == StopReason.COMPLETED and not trace.errors
    last_two = [(n.message.role, n.message.text) for n in trace.graph.path()][-2:]
    assert last_two == [("assistant", "4"), ("user", "right")]
    assert trace.rewards["graded"].score == 1.0
