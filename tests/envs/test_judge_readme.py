"""The README's group-and-judge taskset runs as printed: its group reward and its judge (a fake judge server) score a
group, and its judge endpoint is a `--taskset.judge.*` option of the CLI."""

import re
from pathlib import Path

import tracegym as tg
from tracegym.cli.main import main
from tracegym.testing import FakeOpenAIServer, ScriptedModel

README = Path(__file__).parents[2] / "README.md"


def snippet() -> str:
    section = README.read_text().split("### Group rewards and judge rewards", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def write_module(tmp_path: Path) -> Path:
    path = tmp_path / "qa.py"
    path.write_text(snippet())
    return path


async def test_the_readme_taskset_scores_a_group_with_its_group_reward_and_its_judge(tmp_path):
    module = write_module(tmp_path)
    with FakeOpenAIServer(["VERDICT: yes"], model="Qwen/Qwen3-8B") as judge:
        taskset = tg.load_taskset(f"{module}:QA", {"judge": {"base_url": judge.base_url, "model": "Qwen/Qwen3-8B",
                                                             "api_key_env": None}})
        model = ScriptedModel(rule=lambda request: ["The answer is 4.", "4", "5"][request.sampling.seed])
        traces = await tg.run_group(taskset, taskset[0], model, 3, sampling=tg.Sampling(seed=0))
    assert [t.rewards["shortest_correct"].score for t in traces] == [0.0, 1.0, 0.0]
    assert [t.reward for t in traces] == [1.5, 2.0, 0.5]  # correct + 0.5 x shortest_correct + 0.5 x judge
    assert len(judge.requests) == 3 and all(len(t.judgments) == 1 for t in traces)


def test_the_readme_taskset_takes_its_judge_from_the_command_line(tmp_path, capsys):
    module = write_module(tmp_path)
    assert main(["eval", f"{module}:QA", "--taskset.judge.base-url", "http://judge.example:8000/v1",
                 "--taskset.judge.model", "judge-8b", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "http://judge.example:8000/v1" in out and "judge-8b" in out
