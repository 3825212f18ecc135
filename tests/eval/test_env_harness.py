"""`--env.harness.*` (eval) and an rl environment's `harness`: an agent program drives every rollout of a taskset
whose task class runs tracegym's own turn loop, in process and in the workers of the env server a command starts;
its model calls reach the rollout's trace through the interception proxy and the taskset's rewards score them."""

import json
from pathlib import Path

import pytest

from tracegym.cli.main import main
from tracegym.envs.harness_choice import HarnessChoice
from tracegym.envs.registry import load_taskset
from tracegym.testing import FakeOpenAIServer
from tracegym.train.rl_config import parse_rl_args

ASK_ONCE = """
import json, os, urllib.request
body = json.dumps({"model": os.environ["OPENAI_MODEL"], "messages": json.loads(os.environ["TRACEGYM_MESSAGES"])})
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body.encode(),
                                 headers={"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(request, timeout=30))["choices"][0]["message"]["content"])
"""
"""A program's one model call in plain Python (no SDK), its messages the task's prompt."""

COMMAND = json.dumps(["python3", "-c", ASK_ONCE.replace("{", "{{").replace("}", "}}")])


@pytest.fixture
def server():
    with FakeOpenAIServer(rule=lambda request: request.messages[-1].text[::-1]) as fake:
        yield fake


def traces(out: Path) -> list[dict]:
    [path] = list(out.glob("*/*/traces.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_with_harness(server, out: Path, *flags: str) -> list[dict]:
    args = ["eval", "reverse-text", "-n", "2", "--env.harness.command", COMMAND, "--env.harness.limits",
            '{"wall_seconds": 30}', "--model.base-url", server.base_url, "--output-dir", str(out), "--no-rich",
            *flags]
    assert main(args) == 0
    return traces(out)


def stages(trace: dict) -> set[str]:
    return {span["name"] for span in trace["spans"]}


def lcs(found: list[dict]) -> list[float]:
    return [t["rewards"]["lcs"]["score"] for t in found]


def test_the_env_servers_workers_run_the_program_the_flags_name_and_score_its_reply(server, tmp_path):
    found = run_with_harness(server, tmp_path, "--env.workers", "1")
    assert lcs(found) == [1.0, 1.0]
    assert all({"setup:program", "program"} <= stages(t) for t in found)


def test_in_process_rollouts_run_the_program_the_flags_name(server, tmp_path):
    found = run_with_harness(server, tmp_path, "--no-serve")
    assert lcs(found) == [1.0, 1.0] and "program" in stages(found[0])


def test_the_proxy_key_on_the_programs_command_line_is_one_line_naming_the_flag(server, tmp_path, capsys):
    args = ["eval", "reverse-text", "--env.harness.command", '["agent", "{api_key}"]', "--model.base-url",
            server.base_url, "--output-dir", str(tmp_path / "out")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tracegym eval: --env.harness: Value error, harness command:"), err
    assert not (tmp_path / "out").exists()


def test_a_multi_agent_taskset_refuses_a_program_harness_by_name():
    with pytest.raises(Exception, match="harness: taskset 'debate' is multi-agent"):
        load_taskset("debate").with_harness(HarnessChoice(command=["agent"]))


def test_an_rl_environment_names_its_harness_and_its_env_server_is_started_with_it(tmp_path):
    config = tmp_path / "rl.toml"
    config.write_text('[[orchestrator.train.env]]\nid = "reverse-text"\n'
                      'harness = { command = ["my-agent", "{prompt}"], env = { KEY = "{api_key}" } }\n[trainer]\n')
    parsed, _ = parse_rl_args(["@", str(config)])
    [env] = parsed.orchestrator.train.envs
    args = env.serve_args()
    assert args[args.index("--harness.command") + 1] == '["my-agent", "{prompt}"]'
    assert args[args.index("--harness.env") + 1] == '{"KEY": "{api_key}"}'
