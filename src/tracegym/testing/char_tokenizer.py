"""Char tokenizer: a ChatML tokenizer of one token per character, so a `ChatMLRenderer` (real markup: tool-call
blocks, the turn's close) runs in tests without loading a model's tokenizer.

>>> from tracegym.models.renderer import ChatMLRenderer
>>> ChatMLRenderer(CharTokenizer()).parse([ord(c) + 10 for c in "hi"] + [2]).text
'hi'
"""

from __future__ import annotations

from collections.abc import Sequence


class CharTokenizer:
    """Token `ord(c) + 10` per character; the special tokens `<|im_start|>`, `<|im_end|>`, `<|endoftext|>` are 1-3."""

    special = {"<|im_start|>": 1, "<|im_end|>": 2, "<|endoftext|>": 3}
    eos_token_id, unk_token_id, chat_template = 3, 0, ""

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.special.get(token, 0)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids, at = [], 0
        while at < len(text):
            token = next((t for t in self.special if text.startswith(t, at)), text[at])
            ids.append(self.special[token] if token in self.special else ord(token) + 10)
            at += len(token)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in self.special.items()}
        return "".join(names[t] if t in names else chr(t - 10) for t in ids)
