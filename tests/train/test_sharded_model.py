"""Building the trainer's model on the meta device and filling it from the folder's weights (what each rank of
several does, `trainer.sharded_model`), here in one process: the same model as loading it whole."""

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from tracegym.core.errors import UsageError
from tracegym.models.embedded import embedded_model_dir
from tracegym.train.data_parallel import CheckpointRows, DataParallel
from tracegym.train.trainer import TrainerConfig, sharded_model


@pytest.fixture
def folder(tmp_path):
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                 tie_word_embeddings=True)).save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((embedded_model_dir() / name).read_bytes())
    return tmp_path


def test_checkpoint_rows_reads_only_the_rows_asked_for(tmp_path):
    weight = torch.arange(12.0).reshape(6, 2)
    save_file({"w": weight}, str(tmp_path / "model.safetensors"))
    with CheckpointRows(tmp_path) as rows:
        assert "w" in rows and "v" not in rows
        assert torch.equal(rows.read("w", slice(3, 6)), weight[3:])
        assert rows.read("w", slice(6, 6)).shape == (0, 2)


def test_a_model_filled_from_the_folder_is_the_model_loaded_whole(folder):
    built = sharded_model(TrainerConfig(model=str(folder), lora=False), DataParallel())
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert built.lm_head.weight is built.model.embed_tokens.weight  # still tied
    ids = torch.tensor([[1, 5, 9, 3]])
    assert torch.equal(built(input_ids=ids).logits, loaded(input_ids=ids).logits)  # rotary buffers kept too


def test_the_adapter_starts_as_peft_starts_it(folder):
    model = sharded_model(TrainerConfig(model=str(folder)), DataParallel())
    weights = dict(model.named_parameters())
    a = [v for n, v in weights.items() if ".lora_A." in n]
    b = [v for n, v in weights.items() if ".lora_B." in n]
    assert a and all(bool(v.abs().sum() > 0) for v in a) and all(bool((v == 0).all()) for v in b)
    assert [n for n, v in weights.items() if v.requires_grad] == [n for n in weights if ".lora_" in n]


def test_a_folder_without_a_weight_the_model_needs_is_refused_by_name(folder):
    from safetensors.torch import load_file

    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.norm.weight"]
    save_file(weights, str(folder / "model.safetensors"))
    with pytest.raises(UsageError, match=r"no weight 'model\.norm\.weight'"):
        sharded_model(TrainerConfig(model=str(folder), lora=False), DataParallel())
