"""Scripted model: an in-process model client that answers from a Script, optionally with toy token ids.

With `tokens=True` it renders messages to text with a tiny ChatML-like template and uses UTF-8 bytes as
token ids, so traces carry exact prompt/completion ids and logprobs just as from vLLM. With `prefix_stable=False`
the template renders earlier assistant turns under another header than the one sampled after (as templates that
rewrite past turns do, e.g. dropping their reasoning), so no prompt extends the previous prompt + completion.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from tracegym.core.messages import Message
from tracegym.models.client import ModelRequest, ModelResponse
from tracegym.testing.script import Entry, Fail, Script

GENERATION_PROMPT = "<|assistant|>\n"
END = "<|end|>\n"


def render_body(message: Message) -> str:
    """The text of a message after its role header, as the toy template renders it."""
    calls = "".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in message.tool_calls)
    return f"{message.text}{calls}{END}"


def render(messages: Sequence[Message], *, prefix_stable: bool = True) -> str:
    """The toy template: each message as `<|role|>\\n body`, then the generation prompt; not `prefix_stable`,
    earlier assistant turns open with `<|assistant:earlier|>` instead."""
    def header(m: Message) -> str:
        return "assistant:earlier" if m.role == "assistant" and not prefix_stable else m.role

    return "".join(f"<|{header(m)}|>\n{render_body(m)}" for m in messages) + GENERATION_PROMPT


def encode(text: str) -> list[int]:
    """Toy tokenizer: one token per UTF-8 byte."""
    return list(text.encode())


class ScriptedModel:
    """A ModelClient following a script; records every request in `requests`, and the most calls it had in
    flight at once in `most_in_flight` (for tests of concurrency bounds)."""

    def __init__(self, script: Sequence[Entry] | None = None, rule: Callable[[ModelRequest], Entry] | None = None,
                 *, name: str = "scripted", tokens: bool = False, finish_reason: str | None = None,
                 prefix_stable: bool = True) -> None:
        self.script = Script(script, rule)
        self.prefix_stable = prefix_stable
        self._name = name
        self.tokens = tokens
        self.finish_reason = finish_reason
        self.policy_version: int | None = None
        """Reported on every reply when set (read when the call starts); set it mid-test to move the policy on."""
        self.requests: list[ModelRequest] = []
        self.in_flight = 0
        self.most_in_flight = 0

    @property
    def name(self) -> str:
        return self._name

    async def aclose(self) -> None:
        """Nothing to release: the script lives in this process."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        version = self.policy_version
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            message = await self.script.resolve(request)
        finally:
            self.in_flight -= 1
        if isinstance(message, Fail):
            raise message.error
        prompt = render(request.messages, prefix_stable=self.prefix_stable)
        completion = render_body(message)
        finish = self.finish_reason or ("tool_calls" if message.tool_calls else "stop")
        if not self.tokens:
            return ModelResponse(message, finish, len(encode(prompt)), len(encode(completion)),
                                 policy_version=version)
        prompt_ids, completion_ids = encode(prompt), encode(completion)
        return ModelResponse(
            message,
            finish,
            len(prompt_ids),
            len(completion_ids),
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            completion_logprobs=[-0.5] * len(completion_ids),
            policy_version=version,
        )
