"""`tracegym rl --dry-run`: the resolved config of every process; old keys migrate with a warning."""

import tomllib
from pathlib import Path

from tracegym.cli.main import main
from tracegym.serve.env_server_choice import WorkerPoolChoice

CONFIG = Path(__file__).parents[2] / "configs" / "rl" / "reverse_text.toml"


def test_dry_run_prints_every_process_config_and_starts_nothing(tmp_path, capsys):
    assert main(["rl", "@", str(CONFIG), "--dry-run", "--output-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[run.orchestrator]" in out and "[vllm]" in out and "[env_servers" in out
    plan = tomllib.loads(out)["plan"]
    assert (plan["weight_sync"], plan["teacher"]["route"], plan["trainer"]["torchrun"]) == (
        "merge_adapter", "none", False)
    assert not list(tmp_path.iterdir())


def test_an_old_key_still_works_with_a_warning_naming_the_new_one(tmp_path, capsys):
    old = tmp_path / "old.toml"
    old.write_text("steps = 3\n[orchestrator.train.sampling]\nmax_completion_tokens = 20\n")
    assert main(["rl", "@", str(old), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "max_tokens = 20" in captured.out
    assert "'orchestrator.train.sampling.max_completion_tokens' was renamed 'orchestrator.train.sampling.max_tokens'" \
        in captured.err


def test_rl_and_eval_share_one_sampling_section():
    from tracegym.core.sampling import Sampling
    from tracegym.eval.eval_config import EvalConfig
    from tracegym.train.rl_config import EvalPhase, TrainPhase

    assert TrainPhase.model_fields["sampling"].annotation is Sampling is EvalConfig.model_fields["sampling"].annotation
    assert EvalPhase.model_fields["sampling"].annotation is Sampling


def test_a_negative_temperature_exits_2_naming_the_flag(capsys):
    assert main(["rl", "--orchestrator.train.sampling.temperature", "-1", "--dry-run"]) == 2
    assert "--orchestrator.train.sampling.temperature" in capsys.readouterr().err


def test_an_unknown_key_exits_2_naming_it(capsys):
    assert main(["rl", "--orchestrator.group-sze", "4", "--dry-run"]) == 2
    assert "--orchestrator.group-sze" in capsys.readouterr().err


def test_the_old_orchestrator_sampling_section_migrates_with_a_warning(tmp_path, capsys):
    """`[orchestrator.sampling]` is what prime-rl users write; ours is `[orchestrator.train.sampling]`."""
    old = tmp_path / "prime.toml"
    old.write_text("[orchestrator.sampling]\ntemperature = 0.7\nmax_tokens = 20\n")
    assert main(["rl", "@", str(old), "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert "temperature = 0.7" in captured.out and "max_tokens = 20" in captured.out
    assert "'orchestrator.sampling' was renamed 'orchestrator.train.sampling'" in captured.err


def test_the_old_orchestrator_sampling_flag_migrates_too(capsys):
    assert main(["rl", "--orchestrator.sampling.temperature", "0.3", "--dry-run"]) == 0
    assert "temperature = 0.3" in capsys.readouterr().out


def test_a_nested_flag_typo_suggests_the_right_flag(capsys):
    assert main(["rl", "--orchestrator.group-sze", "4", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--orchestrator.group-sze: unknown option; did you mean --orchestrator.group-size?" in err


def test_a_typo_in_a_toml_file_names_the_file_and_its_toml_key(tmp_path, capsys):
    config = tmp_path / "typo.toml"
    config.write_text("[orchestrator]\ngroup_sze = 4\n")
    assert main(["rl", "@", str(config), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"{config}: [orchestrator] group_sze: unknown key; did you mean [orchestrator] group_size?" in err
    assert "--" not in err


def test_a_bad_value_in_a_toml_file_names_the_file_and_its_toml_key(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text("steps = 3\n[orchestrator.train.sampling]\ntemperature = 'hot'\n")
    assert main(["rl", "@", str(config), "--dry-run"]) == 2
    assert f"{config}: [orchestrator.train.sampling] temperature: Input should be a valid number" in \
        capsys.readouterr().err


def test_a_bad_key_under_an_old_section_name_is_shown_as_written(tmp_path, capsys):
    config = tmp_path / "prime_extra.toml"
    config.write_text("[orchestrator.sampling]\nrepetition_penalty = 1.1\n")
    assert main(["rl", "@", str(config), "--dry-run"]) == 2
    assert f"{config}: [orchestrator.sampling] repetition_penalty: unknown key" in capsys.readouterr().err


def test_a_flag_overriding_a_toml_key_is_named_as_the_flag(tmp_path, capsys):
    config = tmp_path / "fine.toml"
    config.write_text("[orchestrator]\ngroup_size = 4\n")
    assert main(["rl", "@", str(config), "--orchestrator.group-size", "many", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--orchestrator.group-size: Input should be a valid integer" in err and "fine.toml" not in err


def test_dry_run_shows_one_env_server_per_server_the_launcher_starts(capsys):
    """The shipped config trains and evaluates on reverse-text with other seeds: two servers, each its options and
    its worker pool (the defaults of `tracegym serve`)."""
    assert main(["rl", "@", str(CONFIG), "--dry-run"]) == 0
    servers = tomllib.loads(capsys.readouterr().out)["env_servers"]
    pool = {key: value for key, value in WorkerPoolChoice().model_dump().items() if value is not None}
    assert servers == {"reverse-text": {"id": "reverse-text", "weight": 1.0, "options": {"seed": 0}, **pool},
                       "eval:reverse-text": {"id": "reverse-text", "weight": 1.0, "options": {"seed": 12345}, **pool}}


def test_an_env_listed_twice_in_one_phase_exits_2_naming_it(tmp_path, capsys):
    config = tmp_path / "twice.toml"
    config.write_text('[[orchestrator.train.envs]]\nid = "arithmetic"\n[[orchestrator.train.envs]]\nid = "arithmetic"\n'
                      'options = { seed = 1 }\n')
    assert main(["rl", "@", str(config), "--dry-run"]) == 2
    assert "'arithmetic'" in capsys.readouterr().err


def test_the_old_model_keys_move_into_the_model_section(tmp_path, capsys):
    old = tmp_path / "old.toml"
    old.write_text('max_model_len = 512\n[orchestrator]\nclient = "chat"\n')
    assert main(["rl", "@", str(old), "--dry-run"]) == 0
    captured = capsys.readouterr()
    model = tomllib.loads(captured.out)["run"]["model"]
    assert (model["max_model_len"], model["client"]) == (512, "chat")
    assert "'orchestrator.client' was renamed 'model.client'" in captured.err


def test_an_endpoint_elsewhere_is_refused_naming_the_flag(capsys):
    assert main(["rl", "--model.base-url", "http://host:8000/v1", "--dry-run"]) == 2
    assert "--model.base-url" in capsys.readouterr().err


PRIME_RL = """max_steps = 3
[orchestrator]
batch_size = 12
rollouts_per_example = 4
[[orchestrator.{train}env]]
id = "reverse-text"
args = {{ seed = 3 }}
[[orchestrator.eval.env]]
id = "reverse-text"
args = {{ seed = 12345 }}
"""
"""A prime-rl orchestrator config: its environments (`args` their options), steps and batch in its own words."""


def run_of(out: str) -> dict:
    return tomllib.loads(out)["run"]


def test_a_prime_rl_config_loads_as_the_same_run_in_our_words(tmp_path, capsys):
    for train in ("", "train."):  # prime-rl's older and current spelling of the training environments
        config = tmp_path / f"prime-{train}toml"
        config.write_text(PRIME_RL.format(train=train))
        assert main(["rl", "@", str(config), "--dry-run"]) == 0
        run = run_of(capsys.readouterr().out)
        orchestrator = run["orchestrator"]
        assert (run["steps"], orchestrator["tasks_per_step"], orchestrator["group_size"]) == (3, 3, 4)
        assert [(e["id"], e["options"]) for e in orchestrator["train"]["envs"]] == [("reverse-text", {"seed": 3})]
        assert [e["options"] for e in orchestrator["eval"]["envs"]] == [{"seed": 12345}]


def test_a_prime_rl_batch_size_that_is_no_multiple_of_the_group_is_named(tmp_path, capsys):
    config = tmp_path / "prime.toml"
    config.write_text("[orchestrator]\nbatch_size = 10\nrollouts_per_example = 4\n")
    assert main(["rl", "@", str(config), "--dry-run"]) == 2
    assert "batch_size = 10 (prime-rl's rollouts per step) must be a positive multiple of group_size (4)" in \
        capsys.readouterr().err
