"""Embedded VLM: an Idefics3 (SmolVLM) vision-language model made here from the embedded SmolLM2-135M text model and
a small, freshly initialised vision tower, saved once to a Hugging Face directory next to the text model.

Why Idefics3: it is SmolVLM's architecture, whose text tower is SmolLM2 (a Llama), so the embedded model's
weights drop in unchanged; vLLM serves it (`Idefics3ForConditionalGeneration` in its model registry, CPU build
included) and transformers ships its processor, so `AutoProcessor.from_pretrained(dir)` works. (vLLM's Llava also
takes a Llama text tower with a SigLIP vision tower, but its processor knows no image tiles and its template is
not SmolLM2's.) The vision tower is a 2-layer SigLIP-style encoder (hidden 256, 224 px images, 16 px patches);
the connector's pixel shuffle (scale 2) turns its 14x14 patches into `IMAGE_SEQ_LEN` = 49 text-side tokens per
image. Images are not split into tiles (`do_image_splitting` off): each image is one global view, its
placeholder run `<fake_token_around_image><global-img>` + 49 x `<image>` + `<fake_token_around_image>`.
The weights are seeded (`SEED`), so every machine builds the same model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypeVar

from tracegym.core.errors import UsageError
from tracegym.models.embedded import built_once, cache_root, embedded_model_dir, is_complete
from tracegym.models.model_choice import ModelChoice
from tracegym.models.renderer import TOOLS_PROMPT

VLM_DIR_NAME = "smolvlm-tracegym-135m"
"""The VLM's folder in the model cache, and the name vLLM serves it under (a served folder's last part)."""
SCALE_OUT_FLAG = "--enable-scale-out"
"""The vLLM flag that opens its token-in/token-out endpoint, where the token client sends prompts with images."""

SEED = 0
IMAGE_SIZE = 224
PATCH_SIZE = 16
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH_SIZE) ** 2 // SCALE_FACTOR**2
"""`<image>` tokens per image (per tile, were images split)."""
VISION = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 4,
          "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE}
"""The vision tower's shape."""

IMAGE_TOKENS = ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                *(f"<row_{i}_col_{j}>" for i in range(1, 7) for j in range(1, 7))]
"""Tokens the Idefics3 processor expects in the tokenizer, added as special tokens (new embedding rows)."""

_TOOLS_HEAD, _TOOLS_TAIL = (json.dumps(half) for half in TOOLS_PROMPT.format(tools="\x00").split("\x00"))
CHAT_TEMPLATE = (
    r"{%- if messages and messages[0]['role'] == 'system' -%}"
    r"{%- if messages[0]['content'] is string -%}{%- set system = messages[0]['content'] -%}{%- else -%}"
    r"{%- set parts = namespace(text='') -%}{%- for part in messages[0]['content'] -%}"
    r"{%- set parts.text = parts.text + (part['text'] if part['type'] == 'text' else '<image>') -%}{%- endfor -%}"
    r"{%- set system = parts.text -%}{%- endif -%}{%- set turns = messages[1:] -%}"
    r"{%- else -%}{%- set system = none -%}{%- set turns = messages -%}{%- endif -%}"
    r"{%- if system is none and not tools -%}"
    r"{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    r"{%- else -%}"
    r"{%- if system is none -%}{%- set system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face'"
    r" -%}{%- endif -%}"
    r"{%- if tools -%}{%- set system = (system + '\n\n' if system else '') + " + _TOOLS_HEAD
    + r" + (tools | map('tojson') | join('\n')) + " + _TOOLS_TAIL + r" -%}{%- endif -%}"
    r"{{ '<|im_start|>system\n' + system + '<|im_end|>\n' }}"
    r"{%- endif -%}"
    r"{%- for message in turns -%}"
    r"{{ '<|im_start|>' + message['role'] + '\n' }}"
    r"{%- if message['role'] == 'tool' -%}{{ '<tool_response>\n' }}{%- endif -%}"
    r"{%- if message['content'] is string -%}{{ message['content'] }}"
    r"{%- elif message['content'] -%}"
    r"{%- for part in message['content'] -%}"
    r"{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- else -%}{{ '<image>' }}{%- endif -%}"
    r"{%- endfor -%}"
    r"{%- endif -%}"
    r"{%- for call in message.get('tool_calls') or [] -%}"
    r"{%- if not loop.first or message['content'] -%}{{ '\n' }}{%- endif -%}"
    r"""{{ '<tool_call>\n{"name": ' + (call['function']['name'] | tojson) + ', "arguments": '"""
    r"""+ call['function']['arguments'] + '}\n</tool_call>' }}"""
    r"{%- endfor -%}"
    r"{%- if message['role'] == 'tool' -%}{{ '\n</tool_response>' }}{%- endif -%}"
    r"{{ '<|im_end|>\n' }}"
    r"{%- endfor -%}"
    r"{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)
"""SmolLM2's ChatML template (its default system prompt) with what `renderer.ChatMLRenderer` adds, so the two
render alike: the Hermes tool list in the system prompt, content parts (an image part is `<image>`, which the
processor expands; a system message's parts too, which vLLM's chat endpoint hands over as parts even when they are
text only), tool results in `<tool_response>`, calls as `<tool_call>` JSON with their raw arguments."""
TEMPLATE_FILE = "chat_template.jinja"
"""Where the processor keeps the chat template in the VLM's folder."""


def default_vlm_dir() -> Path:
    """Where the embedded VLM lives: `cache_root()/models/smolvlm-tracegym-135m`."""
    return cache_root() / "models" / VLM_DIR_NAME


M = TypeVar("M", bound=ModelChoice)


def vlm_choice(choice: M) -> M:
    """`choice` pointed at the embedded VLM (built first if need be); its server opens the endpoint image prompts
    go to (`SCALE_OUT_FLAG`, added by `launch.server_config` for any model that takes images)."""
    return choice.model_copy(update={"name": str(embedded_vlm_dir()), "vlm": False})


def resolved_vlm(choice: M) -> M:
    """`choice` with `vlm = true` and no `name` resolved to the embedded VLM's folder (`vlm_choice`); any other as
    it is."""
    return vlm_choice(choice) if choice.vlm and choice.name is None else choice


def embedded_vlm_dir(cache_dir: str | Path | None = None) -> Path:
    """The embedded VLM as a Hugging Face directory (`cache_dir`, else `default_vlm_dir()`), made once from the
    embedded text model (made first if need be), under the same lock-and-rename as `embedded_model_dir`."""
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_vlm_dir()
    if is_complete(target):
        return with_current_template(target)
    text_dir = embedded_model_dir()
    return built_once(target, lambda build: build_vlm(text_dir, build), f"idefics3 from {text_dir.name}, seed {SEED}")


def with_current_template(folder: Path) -> Path:
    """`folder` (a built VLM) with `CHAT_TEMPLATE` as its chat template: one built before the template changed gets
    the new one (written aside and renamed in; the weights are the same)."""
    path = folder / TEMPLATE_FILE
    if path.is_file() and path.read_text() != CHAT_TEMPLATE:
        partial = path.with_name(f".{TEMPLATE_FILE}.{os.getpid()}.partial")
        partial.write_text(CHAT_TEMPLATE)
        os.replace(partial, path)
    return folder


def build_vlm(text_dir: Path, out_dir: Path) -> None:
    """Write the VLM into `out_dir`: weights (text tower = `text_dir`'s, vision tower and connector seeded),
    config, and the processor (image processor, tokenizer with the image tokens, chat template)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
        from transformers.models.idefics3 import Idefics3ForConditionalGeneration
    except ImportError as exc:
        raise UsageError(f"building the embedded VLM needs torch and transformers: {exc}") from exc
    tokenizer = save_processor(text_dir, out_dir)
    config = vlm_config(text_dir, tokenizer)
    text = AutoModelForCausalLM.from_pretrained(text_dir, dtype=torch.float32)
    torch.manual_seed(SEED)
    model = Idefics3ForConditionalGeneration(config)  # float32, torch's default
    _copy_text_tower(text, model, len(tokenizer))
    model.save_pretrained(out_dir)


def vlm_config(text_dir: Path, tokenizer: Any) -> Any:
    """The VLM's Idefics3 config: `text_dir`'s model as the text tower (its vocabulary grown to `tokenizer`'s),
    the vision tower `VISION`."""
    from transformers import AutoConfig
    from transformers.models.idefics3 import Idefics3Config

    text = AutoConfig.from_pretrained(text_dir)
    return Idefics3Config(
        vision_config=VISION, text_config=_text_config(text, len(tokenizer)), scale_factor=SCALE_FACTOR,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), pad_token_id=text.pad_token_id,
        tie_word_embeddings=True,
    )


def save_processor(text_dir: Path, out_dir: Path) -> Any:
    """Write the VLM's processor into `out_dir` (the image processor; `text_dir`'s tokenizer with the image tokens
    added; the chat template) and return its tokenizer."""
    from transformers import AutoTokenizer
    from transformers.models.idefics3 import Idefics3ImageProcessor, Idefics3Processor

    tokenizer = AutoTokenizer.from_pretrained(text_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    image_processor = Idefics3ImageProcessor(
        do_image_splitting=False, size={"longest_edge": IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE},
    )
    processor = Idefics3Processor(image_processor, tokenizer, image_seq_len=IMAGE_SEQ_LEN, chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out_dir)
    return processor.tokenizer


def _text_config(text_config: Any, vocab_size: int) -> dict[str, Any]:
    """The text model's config with room for the added image tokens."""
    out: dict[str, Any] = text_config.to_dict()
    out.update(vocab_size=vocab_size, tie_word_embeddings=True)
    out.pop("_name_or_path", None)  # the build folder's path, meaningless elsewhere
    return out


def _copy_text_tower(text: Any, model: Any, vocab_size: int) -> None:
    """Load the text model's weights into the VLM's text tower; each added token's embedding is the mean of the
    text model's (a common start for new rows), the output head tied to the embeddings."""
    import torch

    text.resize_token_embeddings(vocab_size, mean_resizing=True)
    state = {k.removeprefix("model."): v for k, v in text.state_dict().items() if k != "lm_head.weight"}
    missing, unexpected = model.model.text_model.load_state_dict(state, strict=True)
    if missing or unexpected:  # strict=True raises first; kept as a guard for a future loader
        raise RuntimeError(f"text tower mismatch: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        model.lm_head.weight = model.model.text_model.embed_tokens.weight
