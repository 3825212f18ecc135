"""The launch plan of an RL run: how its teacher is reached, whose cores each vLLM server gets, how many servers and
trainer ranks it has here and on Slurm, which env servers it starts, and its weight-sync mode."""

import io
from pathlib import Path

import pytest

from tracegym.core.errors import UsageError
from tracegym.models.vllm_servers import CORES_ENV
from tracegym.train import launch_plan
from tracegym.train.launch_plan import plan_launch
from tracegym.train.launcher import launch
from tracegym.train.rl_config import RLConfig, parse_rl_args
from tracegym.train.weight_sync import SyncMode

SHIPPED = Path(__file__).resolve().parents[2] / "configs" / "rl" / "reverse_text.toml"
RUN = Path("/runs/r")


def opd(scorer: str = "vllm", servers: int = 1, **teacher: object) -> RLConfig:
    return RLConfig.model_validate({"mode": "opd", "teacher": teacher, "opd": {"scorer": scorer},
                                    "model": {"servers": servers}, "trainer": {"model": "/student"}})


@pytest.fixture
def cpu_build(monkeypatch):
    """As on the CPU build of vLLM, with the machine's cores split into named shares."""
    monkeypatch.setattr(launch_plan, "is_cpu_build", lambda: True)
    monkeypatch.setattr(launch_plan, "core_shares", lambda count: [f"share{i}" for i in range(count)])


def test_a_teacher_named_by_its_directory_is_served_by_the_run_and_reached_there(tmp_path):
    plan = plan_launch(opd(name=str(tmp_path), max_model_len=512), RUN)
    assert plan.teacher.route == "served" and plan.teacher.server is not None
    assert (plan.teacher.server.model, plan.teacher.server.max_model_len) == (str(tmp_path), 512)
    assert plan.teacher.server.log_path == RUN / "logs" / "teacher-vllm.log"
    assert plan.teacher.endpoints("http://127.0.0.1:9/v1") == {"teacher_base_url": ["http://127.0.0.1:9/v1"],
                                                               "teacher_model": plan.teacher.server.name}


def test_a_teacher_at_a_base_url_is_reached_there_and_one_scored_in_process_is_not_reached():
    at_url = plan_launch(opd(base_url="http://teacher:8000/v1", name="t"), RUN).teacher
    assert (at_url.route, at_url.server) == ("base_url", None)
    assert at_url.endpoints() == {"teacher_base_url": ["http://teacher:8000/v1"], "teacher_model": "t"}
    in_process = plan_launch(opd(scorer="transformers", name="some/dir"), RUN).teacher
    assert (in_process.route, in_process.server) == ("in_process", None)
    assert in_process.endpoints() == {"teacher_base_url": None, "teacher_model": None}
    rl = plan_launch(parse_rl_args(["@", str(SHIPPED)])[0], RUN).teacher
    assert rl.route == "none" and rl.endpoints() == {"teacher_base_url": None, "teacher_model": None}


def test_a_served_teacher_takes_the_last_share_of_the_cores_and_the_policy_servers_the_others(cpu_build):
    plan = plan_launch(opd(servers=2, name="some/dir"), RUN)
    assert plan.vllm_cores == ["share0", "share1"] and plan.vllm_servers == 2
    assert plan.teacher.server is not None and plan.teacher.server.env[CORES_ENV] == "share2"


def test_without_a_served_teacher_the_policy_servers_split_the_cores_themselves(cpu_build):
    assert plan_launch(opd(servers=2, base_url="http://teacher:8000/v1"), RUN).vllm_cores is None


def test_here_the_trainer_ranks_run_under_torchrun_only_when_there_are_several():
    one = plan_launch(parse_rl_args(["@", str(SHIPPED)])[0], RUN)
    four = plan_launch(parse_rl_args(["@", str(SHIPPED), "--trainer.num-processes", "4"])[0], RUN)
    assert (one.trainer.processes, one.trainer.torchrun, four.trainer.processes, four.trainer.torchrun) == (
        1, False, 4, True)
    assert one.slurm is None and one.trainer.malloc == "tcmalloc" and one.orchestrator.malloc == "system"


def test_on_slurm_each_inference_node_is_a_server_and_the_trainer_ranks_span_the_trainer_nodes(cpu_build):
    config = parse_rl_args(["@", str(SHIPPED), "--cluster", "slurm", "--slurm.inference-nodes", "3",
                            "--slurm.trainer-nodes", "2", "--model.servers", "5"])[0]
    plan = plan_launch(config, RUN)
    assert plan.slurm == config.slurm and plan.vllm_servers == 3 and plan.vllm_cores is None
    assert (plan.trainer.nodes, plan.trainer.processes, plan.trainer.torchrun) == (2, 1, True)


def test_the_env_servers_are_one_per_environment_and_those_elsewhere_are_not_started():
    config = RLConfig.model_validate({"trainer": {"model": "m"}, "orchestrator": {
        "train": {"envs": [{"id": "reverse-text"}, {"id": "arithmetic", "address": "tcp://host:5555"}]},
        "eval": {"envs": [{"id": "reverse-text", "options": {"seed": 9}}]}}})
    plan = plan_launch(config, RUN)
    assert list(plan.env_servers) == ["reverse-text", "arithmetic", "eval:reverse-text"]
    assert list(plan.started_env_servers()) == ["reverse-text", "eval:reverse-text"]


def test_the_weight_sync_mode_shapes_the_policy_server():
    merged = plan_launch(parse_rl_args(["@", str(SHIPPED)])[0], RUN)
    assert merged.weight_sync is SyncMode.MERGE_ADAPTER and merged.vllm.merge_adapters
    loads = plan_launch(parse_rl_args(["@", str(SHIPPED), "--weight-sync", "lora"])[0], RUN)
    assert loads.weight_sync is SyncMode.LOAD_ADAPTER and loads.vllm.enable_lora


def test_the_launcher_refuses_a_plan_laid_out_for_slurm():
    plan = plan_launch(parse_rl_args(["@", str(SHIPPED), "--cluster", "slurm"])[0], RUN)
    with pytest.raises(UsageError, match="Slurm"):
        launch(plan, io.StringIO())
