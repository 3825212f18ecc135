"""A real TRL `GRPOTrainer` step on the embedded SmolLM2 (CPU) with tracegym tasksets through tracegym.interop.trl:
one taskset, then several in one run (TRL's dict of environments, reward functions not applicable to each
other's rows) with no NaN in what TRL logs."""

import functools
import math
import os

import pytest

import tracegym as tg
from tracegym.interop.trl import environment_factory, reward_functions, reward_weights, train_dataset
from tracegym.models.embedded import embedded_model_dir

pytestmark = pytest.mark.slow


def recorded(functions, outputs):
    """The reward functions, each keeping what it returned to TRL."""

    def record(fn):
        @functools.wraps(fn)
        def wrapper(**kwargs):
            outputs.setdefault(fn.__name__, []).extend(result := fn(**kwargs))
            return result

        return wrapper

    return [record(fn) for fn in functions]


def grpo_step(tmp_path, *tasksets, prompts: int, outputs: dict):
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    import torch
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    torch.set_num_threads(1)  # a 135M model on a shared 2-core machine: more threads only contend
    model_dir = str(embedded_model_dir())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # SmolLM2's own template drops tool calls, and TRL refuses it for an environment_factory; Qwen2.5's is ChatML
    # with tools, in the tokens SmolLM2 already has, and TRL knows how to parse its tool calls
    tokenizer.chat_template = qwen2_5_chat_template
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2 * prompts, num_generations=2,
                      max_completion_length=8, max_tool_calling_iterations=1, max_steps=1, logging_steps=1,
                      learning_rate=1e-4, shuffle_dataset=False, use_cpu=True, save_strategy="no", report_to="none",
                      reward_weights=reward_weights(*tasksets))
    trainer = GRPOTrainer(model=model_dir, processing_class=tokenizer, args=args,
                          train_dataset=train_dataset(*tasksets, num_tasks=prompts),
                          environment_factory=environment_factory(*tasksets),
                          reward_funcs=recorded(reward_functions(*tasksets), outputs))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = any(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in before.items())
    return trainer, trainer.state.log_history[0], changed


def test_one_grpo_step_on_a_tracegym_taskset(tmp_path):
    outputs = {}
    trainer, logged, changed = grpo_step(tmp_path, tg.load_taskset("reverse-text"), prompts=1, outputs=outputs)
    assert len(outputs["lcs"]) == 2 and all(0.0 <= r <= 1.0 for r in outputs["lcs"])
    # each reward came from the tracegym scoring of that environment's rollout
    assert [env._trace.rewards["lcs"].score for env in trainer.environments] == outputs["lcs"]
    assert logged["rewards/lcs/mean"] == pytest.approx(sum(outputs["lcs"]) / 2)
    assert math.isfinite(logged["loss"]) and changed == (len(set(outputs["lcs"])) > 1)


def test_several_tasksets_in_one_grpo_run_log_no_nan(tmp_path):
    outputs = {}
    # two tasksets with short prompts: a tool taskset's schemas make its prompts 10x longer, and the CPU step with them
    tasksets = [tg.load_taskset("arithmetic"), tg.load_taskset("reverse-text")]
    trainer, logged, _ = grpo_step(tmp_path, *tasksets, prompts=2, outputs=outputs)
    # rows are [arithmetic, arithmetic, reverse, reverse]; each function applies to its own taskset's rows only
    [arithmetic] = [name for name in outputs if name.startswith("arithmetic/")]
    assert [r is None for r in outputs[arithmetic]] == [False, False, True, True]
    assert [r is None for r in outputs["reverse-text/lcs"]] == [True, True, False, False]
    assert [type(env).__name__ for env in trainer.environments] == ["ArithmeticEnvironment"] * 2 + [
        "ReverseTextEnvironment"] * 2
    numbers = {k: v for k, v in logged.items() if isinstance(v, float)}
    assert {"rewards/reverse-text/lcs/mean", f"rewards/{arithmetic}/mean", "reward"} <= set(numbers)
    assert [k for k, v in numbers.items() if math.isnan(v)] == []
