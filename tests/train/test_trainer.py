"""Trainer on a tiny random Llama: steps, accumulation, logprobs, adapter files, and bit-exact resume."""

import random

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from tracegym.core.errors import UsageError
from tracegym.core.sample import Sample
from tracegym.train.trainer import (
    Trainer,
    TrainerConfig,
    _checkpoint_name,
    adapter_keys,
    apply_lora,
    compile_layers,
)

VOCAB = 64


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: a tiny model gains nothing from more, and on a busy machine OpenMP's spinning threads
    make each step hundreds of times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_trainer(lora: bool = True, **options: object) -> Trainer:
    """The same tiny model every time (seeded), with a LoRA adapter unless `lora` is off; in float32 unless
    `compute_dtype` says otherwise (`auto` would pick bfloat16 on an AMX CPU only, so the tests' numbers would
    depend on the machine)."""
    torch.manual_seed(0)
    model_config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(model_config)
    config = TrainerConfig(model="tiny", lora=lora, lora_rank=4, learning_rate=1e-2,
                           **{"compute_dtype": "float32", **options})
    if lora:
        model = apply_lora(model, config)
        for name, param in model.named_parameters():  # LoRA B starts at zero; move it so every update shows
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.02)
    return Trainer(model, config)


def samples(seed: int, n: int = 4) -> list[Sample]:
    """`n` random samples: a 3-6 token prompt and a 2-5 token completion, advantages of both signs."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt, completion = rng.randint(3, 6), rng.randint(2, 5)
        mask = [False] * prompt + [True] * completion
        out.append(Sample(token_ids=[rng.randrange(VOCAB) for _ in mask], loss_mask=mask,
                          logprobs=[-4.0 if m else 0.0 for m in mask], advantage=1.0 if i % 2 else -1.0,
                          temperature=1.0, policy_version=0))
    return out


def trainable(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


def test_a_step_changes_the_adapter_and_counts_the_version():
    trainer = tiny_trainer()
    before = trainable(trainer)
    trainer.step(samples(1))
    after = trainable(trainer)
    assert trainer.version == 1
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_lora_trains_only_the_adapter():
    trainer = tiny_trainer()
    assert trainable(trainer) and all("lora_" in name for name in trainable(trainer))


def test_full_fine_tuning_steps_the_base_weights():
    trainer = tiny_trainer(lora=False)
    before = trainer.model.model.layers[0].mlp.up_proj.weight.detach().clone()
    trainer.step(samples(1))
    assert not torch.equal(before, trainer.model.model.layers[0].mlp.up_proj.weight)


def test_step_metrics_count_the_loss_tokens():
    batch = samples(2)
    metrics = tiny_trainer().step(batch)
    assert metrics["tokens"] == sum(s.num_trained for s in batch)
    assert metrics["samples"] == 4 and metrics["version"] == 1


def test_splitting_into_micro_batches_accumulates_the_same_gradient():
    # in float32: bfloat16 rounding depends on the padded shapes, which the split changes
    one = tiny_trainer(micro_batch_tokens=4096)
    many = tiny_trainer(micro_batch_tokens=12)
    one.step(samples(3, n=6))
    metrics = many.step(samples(3, n=6))
    assert metrics["micro_batches"] > 1
    grads = zip(one.model.parameters(), many.model.parameters(), strict=True)
    assert all(torch.allclose(a.grad, b.grad, atol=1e-7) for a, b in grads if a.grad is not None)


def test_trainer_logprobs_of_its_own_samples_give_ratio_one():
    trainer = tiny_trainer()
    batch = samples(4)
    own = [s.model_copy(update={"logprobs": lp}) for s, lp in zip(batch, trainer.logprobs(batch), strict=True)]
    metrics = trainer.step(own)
    assert metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["masked_low_frac"] == 0.0 and metrics["masked_high_frac"] == 0.0


def test_trainer_logprobs_are_zero_off_the_loss_mask_and_negative_on_it():
    batch = samples(5)
    for sample, values in zip(batch, tiny_trainer().logprobs(batch), strict=True):
        assert len(values) == len(sample)
        assert all((v < 0) if m else (v == 0) for v, m in zip(values, sample.loss_mask, strict=True))


def test_save_weights_writes_a_peft_adapter_directory(tmp_path):
    path = tiny_trainer().save_weights(tmp_path / "adapter")
    assert (path / "adapter_config.json").is_file() and (path / "adapter_model.safetensors").is_file()


def test_an_adapter_saved_again_into_its_folder_is_the_file_peft_writes(tmp_path):
    trainer = tiny_trainer()
    (trainer.save_weights(tmp_path / "adapter") / "README.md").unlink()  # peft's model card
    trainer.step(samples(1))
    assert not (trainer.save_weights(tmp_path / "adapter") / "README.md").exists()  # only the weights file, by us
    trainer.model.save_pretrained(str(tmp_path / "peft"))
    ours, peft = (safe_open(str(tmp_path / f / "adapter_model.safetensors"), "pt") for f in ("adapter", "peft"))
    assert sorted(ours.keys()) == sorted(peft.keys()) and ours.metadata() == peft.metadata()
    assert all(torch.equal(ours.get_tensor(key), peft.get_tensor(key)) for key in peft.keys())  # noqa: SIM118


def test_an_adapter_folder_that_lost_its_config_is_written_whole_again(tmp_path):
    trainer = tiny_trainer()
    (trainer.save_weights(tmp_path / "adapter") / "adapter_config.json").unlink()
    assert (trainer.save_weights(tmp_path / "adapter") / "adapter_config.json").is_file()


def test_an_adapter_file_with_keys_peft_adds_is_never_rewritten_by_key(tmp_path):
    trainer = tiny_trainer()
    path = trainer.save_weights(tmp_path / "adapter")
    save_file({**load_file(str(path / "adapter_model.safetensors")), "extra.weight": torch.zeros(1)},
              str(path / "adapter_model.safetensors"))
    assert adapter_keys(trainer.model, path) is None


def test_resume_from_a_checkpoint_continues_bit_for_bit(tmp_path):
    straight = tiny_trainer()
    straight.step(samples(1))
    straight.save(tmp_path / "ckpt")
    straight.step(samples(2))

    resumed = tiny_trainer()
    resumed.load(tmp_path / "ckpt")
    assert resumed.version == 1
    resumed.step(samples(2))
    a, b = trainable(straight), trainable(resumed)
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_a_checkpoint_carries_the_callers_state(tmp_path):
    tiny_trainer().save(tmp_path / "ckpt", extra_state={"advantages": {"groups": 3, "filtered": 1}})
    assert tiny_trainer().load(tmp_path / "ckpt") == {"advantages": {"groups": 3, "filtered": 1}}


def test_loading_a_folder_that_is_not_a_checkpoint_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        tiny_trainer().load(tmp_path)


def test_an_empty_step_is_a_usage_error():
    with pytest.raises(UsageError):
        tiny_trainer().step([])


def test_merged_weights_carry_the_adapter_under_base_model_names(tmp_path):
    from safetensors.torch import load_file

    trainer = tiny_trainer()
    trainer.step(samples(0))
    before = trainable(trainer)
    merged = load_file(str(trainer.save_merged(tmp_path, dtype=torch.float32) / "model.safetensors"))
    assert not any("lora" in n or "base_layer" in n or n.startswith("base_model") for n in merged)
    peft_model = trainer.model
    peft_model.merge_adapter()
    expected = dict(peft_model.named_parameters())["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert torch.allclose(merged["model.layers.0.self_attn.q_proj.weight"], expected.detach(), atol=1e-6)
    peft_model.unmerge_adapter()
    assert all(torch.equal(v, trainable(trainer)[k]) for k, v in before.items())  # the adapter is untouched


def test_changed_only_merged_weights_leave_out_just_the_frozen_embeddings(tmp_path):
    from safetensors.torch import load_file

    trainer = tiny_trainer(lora_target_modules=["q_proj", "v_proj"])  # k of vLLM's fused qkv is untouched
    trainer.step(samples(0))
    full = load_file(str(trainer.save_merged(tmp_path / "full") / "model.safetensors"))
    changed = load_file(str(trainer.save_merged(tmp_path / "changed", changed_only=True) / "model.safetensors"))
    assert sorted(set(full) - set(changed)) == ["lm_head.weight", "model.embed_tokens.weight"]
    assert "model.layers.0.self_attn.k_proj.weight" in changed and "model.norm.weight" in changed
    assert all(torch.equal(changed[n], full[n]) for n in changed)


def test_saving_merged_weights_leaves_the_base_weights_bit_identical(tmp_path):
    trainer = tiny_trainer()
    trainer.step(samples(0))
    base = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "base_layer" in n}
    trainer.save_merged(tmp_path)
    after = dict(trainer.model.named_parameters())
    assert base and all(torch.equal(after[n], value) for n, value in base.items())


def test_merged_weights_get_the_base_models_config_and_tokenizer_files_so_they_load_on_their_own(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors", ".tracegym-complete"):
        (base / name).write_text(name)
    trainer = tiny_trainer()
    trainer.config = trainer.config.model_copy(update={"model": str(base)})
    merged = trainer.save_merged(tmp_path / "merged")
    assert sorted(p.name for p in merged.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert (merged / "config.json").read_text() == "config.json"
    assert (merged / "model.safetensors").read_bytes() != b"model.safetensors"  # the merged weights, not the base's


@pytest.mark.parametrize(("dtype", "grad_tolerance"), [("float32", 1e-5), ("bfloat16", 2e-3)])
def test_logprobs_from_the_hidden_states_equal_those_through_the_logits(monkeypatch, dtype, grad_tolerance):
    """In bfloat16 the head's gradient comes from a bfloat16 matmul of the probabilities (`lm_head`), the logits'
    from float32 ones: the gradient norms agree to bfloat16's precision."""
    from tracegym.train import trainer as trainer_module

    straight = tiny_trainer(compute_dtype=dtype)
    assert straight.head is not None
    monkeypatch.setattr(trainer_module, "PLAIN_HEADS", set())
    through = tiny_trainer(compute_dtype=dtype)
    assert through.head is None
    batch = samples(3)
    flat = [[v for row in trainer.logprobs(batch) for v in row] for trainer in (straight, through)]
    assert flat[0] == pytest.approx(flat[1], abs=1e-5)
    assert straight.step(batch)["grad_norm"] == pytest.approx(through.step(batch)["grad_norm"], rel=grad_tolerance)


def test_a_bfloat16_lora_trainer_keeps_its_frozen_weights_in_bfloat16_and_its_adapter_in_float32():
    trainer = tiny_trainer(compute_dtype="bfloat16")
    trainer.step(samples(0))
    dtypes = {p.requires_grad: p.dtype for p in trainer.model.parameters()}
    assert dtypes == {False: torch.bfloat16, True: torch.float32}
    assert {s["exp_avg"].dtype for s in trainer.optimizer.state.values()} == {torch.float32}


def test_a_bfloat16_full_weight_trainer_keeps_float32_weights():
    trainer = tiny_trainer(lora=False, compute_dtype="bfloat16")
    trainer.step(samples(0))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}


def test_bfloat16_logprobs_are_float32s_to_bfloat16_precision():
    batch = samples(3)
    exact, rounded = ([v for row in tiny_trainer(compute_dtype=d).logprobs(batch) for v in row]
                      for d in ("float32", "bfloat16"))
    assert rounded == pytest.approx(exact, abs=3e-2) and rounded != exact


def test_a_bfloat16_trainer_merges_its_adapter_into_the_checkpoints_float32_weights(tmp_path):
    """Not into its frozen weights rounded to bfloat16: the merged weight is rounded once, as vLLM's merge's."""
    trainer = tiny_trainer(compute_dtype="bfloat16")
    generator = torch.Generator().manual_seed(1)
    checkpoint = {_checkpoint_name(n): p.detach().float() + 1e-4 * torch.randn(p.shape, generator=generator)
                  for n, p in trainer.model.named_parameters() if not p.requires_grad}  # between bfloat16 steps
    (tmp_path / "base").mkdir()
    save_file(checkpoint, str(tmp_path / "base" / "model.safetensors"))
    trainer.config = trainer.config.model_copy(update={"model": str(tmp_path / "base")})
    merged = load_file(str(trainer.save_merged(tmp_path / "merged", dtype=torch.float32) / "model.safetensors"))
    layer = trainer.model.base_model.model.model.layers[0].self_attn.q_proj
    name = "model.layers.0.self_attn.q_proj.weight"
    delta = layer.scaling["default"] * (layer.lora_B["default"].weight @ layer.lora_A["default"].weight)
    expected = checkpoint[name] + delta
    assert torch.allclose(merged[name], expected.detach(), atol=1e-6)
    assert torch.equal(merged["model.norm.weight"], checkpoint["model.norm.weight"])


@pytest.mark.parametrize("options", [{"num_processes": 2}, {"gradient_checkpointing": True}])
def test_compile_with_several_processes_or_checkpointing_is_refused_naming_both(options):
    with pytest.raises(ValueError, match=f"compile.*{next(iter(options))}"):
        TrainerConfig(model="tiny", compile=True, **options)


def test_compiling_a_model_without_decoder_layers_is_a_usage_error():
    class Flat(torch.nn.Module):
        def get_decoder(self) -> torch.nn.Module:
            return torch.nn.Linear(2, 2)

    with pytest.raises(UsageError, match="needs a model whose decoder keeps its blocks in"):
        compile_layers(Flat())


def test_a_bfloat16_trainer_without_a_checkpoint_folder_refuses_to_merge_naming_the_model(tmp_path):
    with pytest.raises(UsageError, match=r"trainer\.model 'tiny' is neither a folder nor a downloaded hub model"):
        tiny_trainer(compute_dtype="bfloat16").save_merged(tmp_path / "merged")
