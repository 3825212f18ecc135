"""TRL's own server-free environment classes (its docs, examples and tests, embedded verbatim in `trl_classes`) run
unmodified, each held to what TRL documents for it: its tool set and schemas (compared with transformers'
`get_json_schema`, what TRL offers the model), the prompt TRL assembles, `reset`'s arguments, and the rewards
TRL's own tests expect. Each scripted completion mirrors the `fake_generate` of the TRL test it comes from."""

import inspect
import random

import pytest
import trl_classes as trl
from transformers.utils import get_json_schema

import tracegym as tg
from tracegym.core.messages import ImagePart, TextPart
from tracegym.envs.environment import EnvironmentTaskset, environment_tools
from tracegym.testing import ScriptedModel, reply, tool_call

DONE = "Done!"


def trl_tool_names(env_class: type) -> list[str]:
    """TRL's tool listing (GRPOTrainer.__init__): public functions of the class but `reset` and `get_reward`."""
    return [name for name, _ in inspect.getmembers(env_class, predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


EVERY_CLASS = [
    trl.CounterEnvironment, trl.EchoEnvironment, trl.test_train_with_unknown_environment_raises(),
    trl.DummyEnvironment, trl.test_train_with_environment_owned_reward(),
    trl.test_environment_owned_reward_coexists_with_reward_funcs()[0],
    *trl.test_environment_owned_reward_mixed_environments()[:2],
    *trl.test_multiple_environments_without_dataset_raises(),
    trl.GuessTheWordEnvironment, *trl.test_multiple_environments_expose_only_their_own_tools(),
    trl.docs_increment_env(), trl.CodingEnv, trl.GameEnv, trl.Game2048Env, trl.Darkroom,
]


@pytest.mark.parametrize("env_class", EVERY_CLASS, ids=lambda c: f"{c.__qualname__}")
def test_tools_are_trls_with_the_schemas_get_json_schema_gives(env_class):
    ours = environment_tools(env_class)
    assert [t.name for t in ours] == trl_tool_names(env_class)
    instance = env_class()
    trls = [get_json_schema(getattr(instance, name)) for name in trl_tool_names(env_class)]
    assert [t.spec.to_openai() for t in ours] == trls


def test_a_class_whose_tool_get_json_schema_refuses_is_refused_naming_the_tool():
    """The docs' dataset IncrementEnv elides its tool's docstring ("see the full docstring above"): TRL's
    get_json_schema refuses it as written, and so does tracegym, at load time."""
    env_class = trl.docs_increment_env_with_dataset()
    with pytest.raises(Exception, match="no docstring"):
        get_json_schema(env_class().increment)
    with pytest.raises(tg.UsageError, match="tool 'increment' has no docstring"):
        EnvironmentTaskset(env_class, id="increment", data=[{"target": 3}])


def test_get_reward_is_the_environments_reward_and_no_tool():
    env_class, format_reward = trl.test_environment_owned_reward_coexists_with_reward_funcs()
    taskset = EnvironmentTaskset(env_class, id="guess", data=[{"prompt": "Guess."}],
                                 rewards=[tg.reward(weight=0.5)(format_reward)])
    task = taskset.task(taskset[0])
    assert [s.name for s in task.tool_specs()] == ["guess"]
    # TRL: reward_func_names == ["format_reward", "DummyEnvironment"], reward_weights == [0.5, 1.0]
    assert [(s.name, s.weight) for s in task.scorers_of_kind("reward")] == [("format_reward", 0.5),
                                                                            ("DummyEnvironment", 1.0)]


async def one_rollout_each(taskset, scripts, row=None, **model):
    row = row if row is not None else taskset[0]
    return [await tg.run_rollout(taskset, row, ScriptedModel(s, **model)) for s in scripts]


FACTORY_SCRIPTS = [  # test_train_with_environment_factory: a valid call, a call to a tool that is not there, none
    [reply(None, tool_call("increment", {"step": 1})), DONE],
    [reply(None, tool_call("decrement", {"step": 2})), DONE],
    ["I won't increment"],
]


async def test_environment_factory_counters_and_tool_failures_are_trls():
    def counters(environments, **kwargs):
        return [float(env._counter) for env in environments]

    rows = [{"prompt": [{"role": "user", "content": "Hi"}]}]
    taskset = EnvironmentTaskset(trl.DummyEnvironment, id="dummy", data=rows, rewards=[counters])
    traces = await one_rollout_each(taskset, FACTORY_SCRIPTS)
    # TRL: environments[0]._counter == 1, [1] == 0 (the tool call failed), [2] == 0 (no tool call)
    assert [t.reward for t in traces] == [1.0, 0.0, 0.0]
    # TRL: tools/call_frequency == 2/3, tools/failure_frequency == 1/2
    calls = [t.metrics.get("tool_calls", 0) for t in traces]
    assert sum(1 for c in calls if c) / 3 == pytest.approx(2 / 3)
    assert sum(t.metrics.get("tool_errors", 0) for t in traces) / sum(calls) == pytest.approx(1 / 2)


async def test_environment_owned_reward_scores_one_zero_zero():
    taskset = EnvironmentTaskset(trl.test_train_with_environment_owned_reward(), id="owned")
    traces = await one_rollout_each(taskset, FACTORY_SCRIPTS)
    # TRL: rewards/DummyEnvironment/mean == 1/3 (counters 1, 0, 0)
    assert [t.rewards["DummyEnvironment"].score for t in traces] == [1.0, 0.0, 0.0]
    assert list(traces[0].rewards) == ["DummyEnvironment"]


async def test_mixed_environments_score_get_reward_only_on_its_own_class():
    scored, plain, format_reward = trl.test_environment_owned_reward_mixed_environments()
    rows = [{"environment": "scored"}, {"environment": "scored2"}, {"environment": "plain"}]
    taskset = EnvironmentTaskset({"scored": scored, "scored2": scored, "plain": plain}, id="mixed", data=rows,
                                 rewards=[format_reward])
    traces = await tg.evaluate(taskset, ScriptedModel([DONE]))
    # TRL: reward_func_names == ["format_reward", "ScoredEnvironment"] (one column for the class named twice), and
    # the env reward is [1.0, None] for a ScoredEnvironment and a PlainEnvironment rollout
    rewards = taskset.task(taskset[0]).scorers_of_kind("reward")
    assert [s.name for s in rewards] == ["format_reward", "ScoredEnvironment"]
    assert [{k: r.score for k, r in t.rewards.items()} for t in traces] == [
        {"format_reward": 0.0, "ScoredEnvironment": 1.0}, {"format_reward": 0.0, "ScoredEnvironment": 1.0},
        {"format_reward": 0.0}]
    assert [t.reward for t in traces] == [1.0, 1.0, 0.0] and all(t.ok for t in traces)


async def test_multiple_environments_route_rows_expose_only_their_tools_and_keep_environment_from_reset():
    for seen in (*trl.reset_kwargs_seen.values(), *trl.tool_calls_made.values()):
        seen.clear()
    rows = [{"environment": "counter"}, {"environment": "echo"}]
    taskset = EnvironmentTaskset(trl.MULTIPLE_ENVIRONMENTS, id="multi", data=rows)
    counter, echo = list(taskset)

    def script(request):
        if request.messages[-1].role == "tool":
            return DONE
        [tool] = request.tools
        return reply(None, tool_call("increment", {"step": 1}) if tool.name == "increment" else
                     tool_call("shout", {"text": "hi"}))

    model = ScriptedModel(rule=script)
    traces = [await tg.run_rollout(taskset, row, model) for row in (counter, echo)]
    assert [[t.name for t in r.tools] for r in model.requests[::2]] == [["increment"], ["shout"]]
    assert [t.prompt[-1].text for t in traces] == ["Count.", "Echo."]  # no prompt column: reset's text is the prompt
    assert [[m.text for m in t.messages if m.role == "tool"] for t in traces] == [["1"], ["HI"]]
    assert trl.tool_calls_made == {"increment": [1], "shout": ["hi"]}
    assert trl.reset_kwargs_seen == {"counter": [{}], "echo": [{}]}  # the row's keys, `environment` taken out


async def test_an_unknown_environment_is_a_task_error_naming_it():
    taskset = EnvironmentTaskset({"counter": trl.test_train_with_unknown_environment_raises()}, id="unknown",
                                 data=[{"prompt": "Hi", "environment": "unknown"}])
    [trace] = await tg.evaluate(taskset, ScriptedModel([DONE]))
    assert trace.errors[0].kind == tg.ErrorKind.TASK and trace.errors[0].stage == "setup"
    assert "'unknown' is not among the environments: counter" in trace.errors[0].message


def test_a_dict_of_environments_without_rows_is_refused_as_trl_refuses_it():
    env_a, env_b = trl.test_multiple_environments_without_dataset_raises()
    with pytest.raises(tg.UsageError, match="needs rows with an 'environment' column"):
        EnvironmentTaskset({"a": env_a, "b": env_b}, id="ab")


async def test_an_environment_that_owns_its_data_gets_trls_placeholder_row_and_returns_the_prompt():
    seen = []

    class Recording(trl.GuessTheWordEnvironment):
        def reset(self, **kwargs):
            seen.append(kwargs)
            return super().reset(**kwargs)

    taskset = EnvironmentTaskset(Recording, id="guess", rewards=[trl.reward_len])
    assert not taskset.bounded
    completions = ["Done!", "DoneDone!", "DoneDoneDone!"]  # test_train_with_environment_owned_data's three
    traces = await tg.evaluate(taskset, ScriptedModel(rule=lambda r: completions[len(seen) - 1]), num_tasks=3,
                                 concurrency=1)
    assert [t.reward for t in traces] == [5.0, 9.0, 13.0]
    assert [m.to_openai() for m in traces[0].prompt] == [{"role": "user", "content": "Guess the 5-letter word."}]
    assert seen == [{"prompt": [{"role": "user", "content": ""}]}] * 3  # what TRL's placeholder dataset passes


async def test_docs_increment_env_self_samples_its_target_and_scores_itself():
    random.seed(0)
    taskset = EnvironmentTaskset(trl.docs_increment_env(), id="increment")

    def solve(request):
        if request.messages[-1].role == "tool":
            return DONE
        target = int(request.messages[-1].text.removeprefix("Increment the counter by ").rstrip("."))
        return reply(None, tool_call("increment", {"step": target}))

    traces = await tg.evaluate(taskset, ScriptedModel(rule=solve), num_tasks=4)
    assert [t.rewards["IncrementEnv"].score for t in traces] == [1.0] * 4
    assert all(t.prompt[0].text.startswith("Increment the counter by ") for t in traces)


async def test_docs_multiple_environments_branch_on_the_environment_type():
    def reward_func(environments, **kwargs):  # the docs: "it can branch on the environment type"
        return [1.0 if isinstance(env, trl.CodingEnv) else 0.5 for env in environments]

    rows = [{"environment": "coding"}, {"environment": "game"}]
    taskset = EnvironmentTaskset(trl.DOCS_ENVIRONMENTS, id="docs", data=rows, rewards=[reward_func])
    model = ScriptedModel([DONE])
    traces = await tg.evaluate(taskset, model)
    assert [t.reward for t in traces] == [1.0, 0.5]
    assert sorted([t.name for t in r.tools] for r in model.requests) == [["move"], ["run_code"]]


async def test_2048_plays_until_the_game_says_done_and_scores_its_score():
    random.seed(3)
    rows = [{"prompt": [{"role": "user", "content": trl.PROMPT}]}]
    taskset = EnvironmentTaskset(trl.Game2048Env, id="2048", data=rows, rewards=[trl.reward_score], max_turns=2000)
    moves = ["left", "down", "right", "up"]
    model = ScriptedModel(rule=lambda r: reply(None, tool_call("move", {"direction": moves[len(r.messages) // 2 % 4]})))
    [trace] = await tg.evaluate(taskset, model)
    # TRL appends reset's text to the prompt as is, with nothing between
    assert trace.prompt[0].text.startswith(trl.PROMPT + "score=0.0\n")
    assert trace.stop_reason == tg.StopReason.STOP_CONDITION and trace.stopped_by == "done"
    last = [m.text for m in trace.messages if m.role == "tool"][-1]
    assert last.endswith("done=True") and trace.errors == []  # ended at done: no "Game over." call after it
    assert trace.reward == float(last.split("\n")[0].removeprefix("score=")) > 0


async def test_independent_darkroom_images_async_tools_done_and_every_reward_convention():
    taskset = EnvironmentTaskset(trl.Darkroom, id="darkroom", data=[{"prompt": [{"role": "user", "content": "Hi."}],
                                                                     "room": "cellar"}],
                                 rewards=[trl.lit_photos])
    script = [reply(None, tool_call("switch", {"on": True})), reply(None, tool_call("photograph")),
              reply(None, tool_call("leave")), "never asked"]
    model = ScriptedModel(script, tokens=True)
    [trace] = await tg.evaluate(taskset, model)
    assert trace.prompt[0].content == [TextPart(text="Hi."), TextPart(text=" You stand in the cellar.")]
    photo = [m for m in trace.messages if m.role == "tool"][1]
    image, caption = photo.content
    assert isinstance(image, ImagePart) and image.image_url["url"].startswith("data:image/png;base64,")
    assert caption == TextPart(text="Click.")
    assert trace.stopped_by == "done" and len(model.requests) == 3
    assert {k: r.score for k, r in trace.rewards.items()} == {"lit_photos": 1.0, "Darkroom": 1.0}
    assert trace.metrics["completion_tokens"] > 0  # log_metric, from the completion_ids it was given
    assert [t.name for t in model.requests[0].tools] == ["describe", "leave", "photograph", "switch"]


class AbstainingEnvironment:
    """An environment whose `get_reward` abstains (None) until its episode is won."""

    def reset(self, **kwargs):
        self.won = kwargs.get("won", False)
        return "Say something."

    def get_reward(self):
        return 1.0 if self.won else None


async def test_a_get_reward_of_none_does_not_apply_as_in_trl_it_is_no_error():
    taskset = EnvironmentTaskset(AbstainingEnvironment, id="abstain", data=[{"won": False}, {"won": True}])
    traces = await tg.evaluate(taskset, ScriptedModel(["hi", "hi"]))
    assert [list(t.rewards) for t in traces] == [[], ["AbstainingEnvironment"]]
    assert all(t.ok and not t.errors for t in traces)
