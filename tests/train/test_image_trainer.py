"""The trainer on the embedded VLM (transformers, CPU): logprobs with images are those of the model's own forward
with the processor's pixel values, the images change them, and the adapter sits on the text tower."""

import hashlib
import io

import pytest
import torch
from PIL import Image

from tracegym.core.graph import ImageSpan
from tracegym.core.sample import Sample
from tracegym.models.embedded_vlm import embedded_vlm_dir
from tracegym.train.image_inputs import ImageInputs
from tracegym.train.trainer import TrainerConfig, make_trainer

QUESTION = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Which colour is this?"}]}]


def png(colour: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (48, 32), colour).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def vlm():
    from transformers import AutoModelForImageTextToText, AutoProcessor

    folder = embedded_vlm_dir()
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    return folder, processor, model


@pytest.fixture(scope="module")
def pictures():
    return {hashlib.sha256(data).hexdigest(): data for data in (png((220, 20, 20)), png((20, 20, 220)))}


@pytest.fixture(scope="module")
def trainer(vlm, pictures):
    folder, processor, model = vlm
    config = TrainerConfig(model=str(folder), lora_rank=4, lora_alpha=8,
                           compute_dtype="float32")  # compared with the model's own forward to 1e-4
    return make_trainer(model, config, pad_id=processor.tokenizer.pad_token_id,
                        images=ImageInputs(processor.image_processor, pictures.__getitem__))


def encoded(processor, data: bytes, answer: str = "It is red.") -> dict[str, torch.Tensor]:
    text = processor.apply_chat_template(QUESTION, add_generation_prompt=True) + answer + "<|im_end|>"
    return processor(text=[text], images=[[Image.open(io.BytesIO(data)).convert("RGB")]], return_tensors="pt")


def image_sample(processor, sha: str, data: bytes, answer: str = "It is red.") -> Sample:
    ids = encoded(processor, data, answer)["input_ids"][0].tolist()
    fake = processor.tokenizer.convert_tokens_to_ids("<fake_token_around_image>")
    start = ids.index(fake)
    end = ids.index(fake, start + 1) + 1
    answer_len = len(processor.tokenizer(answer + "<|im_end|>")["input_ids"])
    n = len(ids)
    return Sample(token_ids=ids, loss_mask=[False] * (n - answer_len) + [True] * answer_len, logprobs=[0.0] * n,
                  images=[ImageSpan(offset=start, length=end - start, sha256=sha)])


@pytest.fixture(scope="module")
def red(vlm, pictures, trainer):
    """The first picture's sample, its encoding, and the trainer's logprobs of its loss tokens (before any step)."""
    _, processor, _ = vlm
    sha, data = next(iter(pictures.items()))
    sample = image_sample(processor, sha, data)
    return sample, encoded(processor, data), trainer_logprobs(trainer, sample)


def direct_logprobs(model, inputs: dict[str, torch.Tensor], with_image: bool, mask: list[bool]) -> torch.Tensor:
    kwargs = {"input_ids": inputs["input_ids"]}
    if with_image:
        kwargs |= {"pixel_values": inputs["pixel_values"], "pixel_attention_mask": inputs["pixel_attention_mask"]}
    with torch.no_grad():
        logits = model(**kwargs).logits[0, :-1].float()
    targets = inputs["input_ids"][0, 1:]
    taken = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    return taken[torch.tensor(mask[1:])]


def trainer_logprobs(trainer, sample: Sample) -> torch.Tensor:
    [values] = trainer.logprobs([sample])
    return torch.tensor(values)[torch.tensor(sample.loss_mask)]


def test_trainer_logprobs_with_an_image_equal_the_models_forward_with_the_processors_pixels(trainer, red):
    sample, inputs, logprobs = red
    assert torch.allclose(logprobs, direct_logprobs(trainer.model, inputs, True, sample.loss_mask), atol=1e-4)


def test_trainer_logprobs_with_an_image_differ_from_a_forward_without_it(trainer, red):
    sample, inputs, logprobs = red
    assert (logprobs - direct_logprobs(trainer.model, inputs, False, sample.loss_mask)).abs().max() > 1e-3


def test_samples_sharing_a_prompt_with_other_images_each_get_their_own_images_logprobs(vlm, pictures, trainer, red):
    _, processor, _ = vlm
    blue = image_sample(processor, *list(pictures.items())[1])
    together = trainer.logprobs([red[0], blue])
    assert torch.allclose(torch.tensor(together[0])[torch.tensor(red[0].loss_mask)], red[2], atol=1e-4)
    assert torch.allclose(torch.tensor(together[1]), torch.tensor(trainer.logprobs([blue])[0]), atol=1e-4)
    assert together[0] != together[1]


def test_a_step_on_image_samples_trains_the_text_tower_adapter_only(trainer, red):
    sample = red[0].model_copy(update={"advantage": 1.0})
    trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    metrics = trainer.step([sample])
    assert metrics["tokens"] > 0 and all(".text_model." in n and "lora_" in n for n in trained)


def test_lora_projector_puts_an_adapter_on_the_connector_too(vlm):
    from transformers import AutoModelForImageTextToText

    folder, _, _ = vlm
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    trainer = make_trainer(model, TrainerConfig(model=str(folder), lora_rank=2, lora_projector=True))
    trained = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert any("connector" in n for n in trained) and not any("vision_model" in n for n in trained)


def test_image_samples_on_a_trainer_without_image_inputs_are_refused_by_name(vlm, pictures):
    from transformers import AutoModelForImageTextToText

    folder, processor, _ = vlm
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    trainer = make_trainer(model, TrainerConfig(model=str(folder), lora_rank=2))
    sha, data = next(iter(pictures.items()))
    with pytest.raises(Exception, match="takes text only"):
        trainer.logprobs([image_sample(processor, sha, data)])
