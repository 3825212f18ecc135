"""`tracegym eval path/file.py:EnvClass`: a TRL environment class (or TRL's dict of them) named as a taskset id runs
as written, with its reward functions named by `--taskset.rewards` and its rows from `--taskset.rows` or its own
`reset`; what is missing or wrong is one line naming it."""

import json
from pathlib import Path

import pytest

import tracegym as tg
from tracegym.cli.main import main
from tracegym.testing import FakeOpenAIServer, ScriptedModel, reply, tool_call

FILE = Path(__file__).parent / "trl_classes.py"


def spec(name: str) -> str:
    return f"{FILE}:{name}"


def test_a_class_that_takes_no_config_loads_as_a_taskset():
    taskset = tg.load_taskset(spec("GuessTheWordEnvironment"), {"rewards": ["reward_len"]})
    assert taskset.id == "GuessTheWordEnvironment" and not taskset.bounded
    assert taskset.config.rewards == ["reward_len"]


def test_a_class_without_any_reward_is_one_line_saying_how_to_give_one():
    with pytest.raises(tg.UsageError, match=r"taskset 'DummyEnvironment' has no reward: name its reward functions "
                                            r"with --taskset.rewards NAME \(functions in .*trl_classes.py\)"):
        tg.load_taskset(spec("DummyEnvironment"))


@pytest.mark.parametrize(("options", "error"), [
    ({"rewards": ["no_such_reward"]}, r"--taskset.rewards 'no_such_reward': no function 'no_such_reward' in"),
    ({"rewards": ["reward_len"], "reward_weights": [1.0, 2.0]}, "has 2 weights for 1 rewards"),
    ({"rewards": ["reward_len"], "rows": "/no/such/rows.jsonl"}, r"--taskset.rows '/no/such/rows.jsonl': no such file"),
    ({"rewards": ["reward_len"], "rowz": "x"}, r"field 'rowz'.*did you mean 'rows'\?"),
])
def test_bad_options_are_one_line_naming_the_flag(options, error):
    with pytest.raises(tg.UsageError, match=error):
        tg.load_taskset(spec("GuessTheWordEnvironment"), options)


def test_a_bad_rows_file_names_its_line(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"environment": "counter"}\n{"environment": \n')
    with pytest.raises(tg.UsageError, match=r"rows.jsonl': line 2: Expecting value"):
        tg.load_taskset(spec("MULTIPLE_ENVIRONMENTS"), {"rows": str(rows), "rewards": ["reward_len"]})
    rows.write_text('[{"environment": "counter"}, 3]')
    with pytest.raises(tg.UsageError, match=r"rows.jsonl': row 2 is not a JSON object"):
        tg.load_taskset(spec("MULTIPLE_ENVIRONMENTS"), {"rows": str(rows), "rewards": ["reward_len"]})


def run_eval(tmp_path: Path, server: FakeOpenAIServer, *args: str) -> list[dict]:
    assert main(["eval", *args, "--model.base-url", server.base_url, "--output-dir", str(tmp_path / "out"),
                 "--no-rich"]) == 0
    [run] = list((tmp_path / "out").glob("*/*"))
    return [json.loads(line) for line in (run / "traces.jsonl").read_text().splitlines()]


def test_eval_runs_a_class_that_owns_its_data_in_env_server_workers(tmp_path):
    with FakeOpenAIServer(["DoneDone!"]) as server:
        traces = run_eval(tmp_path, server, spec("GuessTheWordEnvironment"), "-n", "2", "--taskset.rewards",
                          '["reward_len"]')
    assert [t["rewards"]["reward_len"]["score"] for t in traces] == [9.0, 9.0]


def test_eval_runs_a_class_over_a_rows_file_with_weighted_rewards_and_its_own(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"prompt": [{"role": "user", "content": "Go."}], "room": room})
                              for room in ("attic", "cellar")))
    script = [reply(None, tool_call("switch", {"on": True})), reply(None, tool_call("photograph")),
              reply(None, tool_call("leave"))]
    with FakeOpenAIServer(script) as server:
        traces = run_eval(tmp_path, server, spec("Darkroom"), "--no-serve", "--taskset.rows", str(rows),
                          "--taskset.rewards", '["lit_photos"]', "--taskset.reward-weights", "[0.5]")
    assert [{k: (r["score"], r["weight"]) for k, r in t["rewards"].items()} for t in traces] == [
        {"lit_photos": (1.0, 0.5), "Darkroom": (1.0, 1.0)}] * 2
    assert sorted(t["task"]["room"] for t in traces) == ["attic", "cellar"]  # traces.jsonl is in finishing order
    assert all(t["stopped_by"] == "done" for t in traces)


ROWS = {
    "MULTIPLE_ENVIRONMENTS": [{"environment": "counter"}, {"environment": "echo"}],
    "DOCS_ENVIRONMENTS": [{"environment": "coding"}, {"environment": "game"}],
    "Game2048Env": [{"prompt": [{"role": "user", "content": "Play."}]}],
    "DummyEnvironment": [{"prompt": [{"role": "user", "content": "Hi."}]}],
    "Darkroom": [{"prompt": [{"role": "user", "content": "Hi."}], "room": "attic"}],
}


@pytest.mark.parametrize("name", [*ROWS, "GuessTheWordEnvironment"])
async def test_every_module_level_trl_class_runs_by_its_file_path(name, tmp_path):
    options = {"rewards": ["reward_len"]}
    if name in ROWS:
        (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(row) for row in ROWS[name]))
        options["rows"] = str(tmp_path / "rows.jsonl")
    traces = await tg.evaluate(tg.load_taskset(spec(name), options), ScriptedModel(["Done!"]), num_tasks=2)
    assert [t.rewards["reward_len"].score for t in traces] == [5.0] * len(traces) and all(t.ok for t in traces)
