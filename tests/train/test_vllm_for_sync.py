"""The run's vLLM as each weight sync needs it: merged LoRA runs load the merge extension, LoRA-loading runs
do not; a full fine-tune reloads merged weights through the dev routes."""

from tracegym.train.launch_plan import plan_launch
from tracegym.train.rl_config import parse_rl_args

SHIPPED = "configs/rl/reverse_text.toml"


def served(tmp_path, *flags: str):
    return plan_launch(parse_rl_args(["@", SHIPPED, *flags])[0], tmp_path).vllm


def test_a_merged_lora_run_lets_vllm_merge_each_adapter(tmp_path):
    config = served(tmp_path)
    assert config.merge_adapters and not config.enable_lora


def test_a_lora_loading_run_enables_lora_and_no_merges(tmp_path):
    config = served(tmp_path, "--weight-sync", "lora")
    assert config.enable_lora and not config.merge_adapters


def test_a_full_fine_tune_reloads_merged_weights_through_the_dev_routes(tmp_path):
    config = served(tmp_path, "--trainer.lora", "false")
    assert not config.merge_adapters and config.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_a_full_fine_tune_with_lora_weight_sync_is_refused_naming_both_keys(capsys):
    """vLLM would be handed a model directory as an adapter at the first publish, after every process started."""
    from tracegym.cli.main import main

    assert main(["rl", "@", SHIPPED, "--trainer.lora", "false", "--weight-sync", "lora", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "weight_sync = 'lora'" in err and "trainer.lora = false" in err
