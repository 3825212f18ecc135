"""Judge: a reward that asks a model for a verdict on a rollout's answer (verifiers' judge rubric).

`Judge(endpoint, prompt)` is a reward function: give it to a taskset (`rewards=[judge]`) or call `await
judge.score(task, trace)` from a Task's own reward. For each trace it renders `prompt` (a `str.format` template:
`{question}` the task's prompt, `{answer}` its reference answer, `{response}` the rollout's last reply, and any
other field of the task row by name), asks the judge model once (temperature 0 unless `sampling` says otherwise),
reads a score from the reply (`verdicts`: the last `VERDICT: WORD` mapped to a score; or a `parse` function of
your own), and records the call on the trace (`Trace.judgments`). Verdicts are cached by the rendered prompt, so
the same answer to the same task is judged once per process (the rollouts of a group that answered alike, a
resumed run); `fresh_verdicts()` turns the cache off where the judge's own noise is the point (`tracegym rescore
--repeat`).

A judge that cannot give a verdict (its endpoint down or past `timeout`, a reply that does not parse) raises a
`JudgeError`: the reward is recorded None with an error of kind `judge` on the trace, never a 0, and training
leaves the rollout out (`judge_error`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import re
import string
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tracegym.core.errors import JudgeError, UsageError, message_of
from tracegym.core.judgment import Judgment
from tracegym.core.messages import Message, system, user
from tracegym.core.sampling import Sampling
from tracegym.core.trace import Trace
from tracegym.envs.scorers import Scorer, mark
from tracegym.models.client import ModelRequest
from tracegym.models.connect import make_client
from tracegym.models.endpoint import Endpoint

PROMPT = """Judge whether a response answers a question correctly.

Question:
{question}

Reference answer:
{answer}

Response:
{response}

Is the response correct? End your reply with one line: VERDICT: yes or VERDICT: no"""
"""The default judge prompt: a correct/incorrect verdict against the reference answer, read by `VERDICTS`."""
VERDICTS: Mapping[str, float] = {"yes": 1.0, "no": 0.0}
"""The default verdicts and the score each pays."""
CACHE_SIZE = 10_000
"""Verdicts one judge keeps (the oldest are forgotten first)."""
_VERDICT = re.compile(r"VERDICT\s*:\s*\**\s*([A-Za-z0-9_.+-]+)", re.IGNORECASE)
_FRESH: contextvars.ContextVar[bool] = contextvars.ContextVar("tracegym_fresh_verdicts", default=False)


@contextlib.contextmanager
def fresh_verdicts() -> Iterator[None]:
    """Within this block (and the asyncio runs started in it), judges ask their model again instead of answering
    from their cache: each scoring measures the judge afresh."""
    token = _FRESH.set(True)
    try:
        yield
    finally:
        _FRESH.reset(token)


class Judge:
    """A judge reward: `Judge(Endpoint(base_url=..., model=...), prompt=TEMPLATE, name="judge", weight=1.0)`."""

    def __init__(self, endpoint: Endpoint, prompt: str = PROMPT, *, name: str = "judge", weight: float = 1.0,
                 verdicts: Mapping[str, float] | None = None, parse: Callable[[str], float] | None = None,
                 system_prompt: str | None = None, sampling: Sampling | None = None, timeout: float = 50.0,
                 cache: bool = True) -> None:
        if verdicts is not None and parse is not None:
            raise UsageError(f"judge {name!r}: give verdicts or parse, not both")
        self.endpoint = endpoint.model_copy(update={"client": "chat", "tokens": "off"})  # a verdict needs no tokens
        self.prompt, self.name = prompt, name
        self.fields = template_fields(prompt, name)
        self.verdicts = {k.lower(): float(v) for k, v in (verdicts if verdicts is not None else VERDICTS).items()}
        self.parse = parse
        """Reads a score from the judge's reply (raising when it cannot); None: the last `VERDICT: WORD`."""
        self.system_prompt = system_prompt
        self.sampling = sampling or Sampling(temperature=0.0, max_tokens=512)
        self.timeout = timeout
        """Seconds one judge call may take (the scoring stage's own timeout still bounds the whole reward)."""
        self.cache = cache
        self._verdicts: collections.OrderedDict[str, tuple[str, float]] = collections.OrderedDict()
        self._asking: dict[str, asyncio.Future[tuple[str, float]]] = {}
        self.calls = 0
        """Calls made to the judge model (cached verdicts not counted)."""
        mark(self, Scorer(self, "reward", name, weight))  # so `rewards=[judge]` takes it as a reward

    async def __call__(self, task: Any, trace: Trace) -> float:
        """The reward: this judge's score of `trace` (a reward function's `(task, trace)`)."""
        return await self.score(task, trace)

    async def score(self, task: Any, trace: Trace) -> float:
        """Judge `trace` (a rollout of `task`): the score read from the verdict, the call recorded on the trace; a
        JudgeError when no verdict could be had."""
        prompt = self.render(task, trace)
        started = time.monotonic()
        cached = self.cache and not _FRESH.get() and prompt in self._verdicts
        try:
            if cached:
                reply, value = self._verdicts[prompt]
            else:
                (reply, value), asked = await self._ask_once(prompt)
                cached = not asked
        except JudgeError as exc:
            trace.judgments.append(Judgment(judge=self.name, model=self.endpoint.model, prompt=prompt,
                                            reply=exc.reply, seconds=time.monotonic() - started))
            raise
        trace.judgments.append(Judgment(judge=self.name, model=self.endpoint.model, prompt=prompt, reply=reply,
                                        score=value, cached=cached,
                                        seconds=0.0 if cached else time.monotonic() - started))
        return value

    def render(self, task: Any, trace: Trace) -> str:
        """The judge prompt for `trace`: the template filled from the task row and the rollout's last reply."""
        data = trace.task
        row = data.model_dump(mode="json")
        values = {**{k: "" if v is None else v for k, v in row.items()}, "question": _question(trace),
                  "answer": "" if data.answer is None else str(data.answer), "response": trace.last_reply}
        missing = [f for f in self.fields if f not in values]
        if missing:
            raise JudgeError(f"judge {self.name!r}: its prompt names {{{missing[0]}}}, which task {trace.task_key!r} "
                             f"has no field of (fields: question, answer, response, {', '.join(sorted(row))})")
        return self.prompt.format_map(values)

    async def _ask_once(self, prompt: str) -> tuple[tuple[str, float], bool]:
        """The verdict on `prompt`, asked once even when several rollouts want it at the same time (one whose
        asker was cancelled is asked again); and whether this call asked (False: it shared another's)."""
        asking = self._asking.get(prompt)
        if asking is not None and asking.get_loop() is asyncio.get_running_loop():
            await asyncio.wait([asking])  # cancelling this waiter leaves the asker's call alone
            if not asking.cancelled():
                return asking.result(), False  # its JudgeError, if it failed, is this rollout's too
        future: asyncio.Future[tuple[str, float]] = asyncio.get_running_loop().create_future()
        self._asking[prompt] = future
        try:
            verdict = await self._ask(prompt)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: there may be no waiter
            raise
        finally:
            if self._asking.get(prompt) is future:
                del self._asking[prompt]
        future.set_result(verdict)
        self._remember(prompt, verdict)
        return verdict, True

    async def _ask(self, prompt: str) -> tuple[str, float]:
        messages: list[Message] = [system(self.system_prompt)] if self.system_prompt else []
        messages.append(user(prompt))
        self.calls += 1
        client = make_client(self.endpoint)
        try:
            async with asyncio.timeout(self.timeout):
                response = await client.complete(ModelRequest(messages, sampling=self.sampling))
        except TimeoutError:
            raise JudgeError(f"judge {self.name!r}: model {self.endpoint.model!r} gave no verdict within "
                             f"{self.timeout:g} s") from None
        except Exception as exc:  # the judge's endpoint failing, whatever the client raised: the judge's error
            raise JudgeError(f"judge {self.name!r}: model {self.endpoint.model!r} at {self.endpoint.base_url} "
                             f"failed: {message_of(exc)}") from exc
        finally:
            await client.aclose()
        reply = response.message.text
        return reply, self._read(reply)

    def _read(self, reply: str) -> float:
        """The score in the judge's reply; a JudgeError (carrying the reply) when it has none."""
        if self.parse is None:
            return self._verdict(reply)
        try:
            return float(self.parse(reply))
        except Exception as exc:  # a parse function of the user's own failing on this reply
            raise JudgeError(f"judge {self.name!r}: its parse failed on the reply: {message_of(exc)}",
                             reply) from exc

    def _verdict(self, reply: str) -> float:
        found = _VERDICT.findall(reply)
        word = found[-1].strip(".*").lower() if found else None
        if word not in self.verdicts:
            said = f"said VERDICT: {found[-1]}" if found else "gave no 'VERDICT: ...' line"
            raise JudgeError(f"judge {self.name!r} {said}; a verdict must be one of {', '.join(self.verdicts)}",
                             reply)
        return self.verdicts[word]

    def _remember(self, prompt: str, verdict: tuple[str, float]) -> None:
        if not self.cache:
            return
        self._verdicts[prompt] = verdict
        self._verdicts.move_to_end(prompt)
        while len(self._verdicts) > CACHE_SIZE:
            self._verdicts.popitem(last=False)


def template_fields(prompt: str, name: str) -> list[str]:
    """The field names a judge prompt template uses; a UsageError naming the judge when it is no valid template
    (an unmatched brace, a positional `{}`)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None]
    except ValueError as exc:
        raise UsageError(f"judge {name!r}: its prompt is not a valid template: {exc}") from None
    bad = next((f for f in fields if not f.isidentifier()), None)
    if bad is not None:
        raise UsageError(f"judge {name!r}: its prompt names {{{bad}}}; name fields like {{question}}, {{answer}}, "
                         "{response}")
    return fields


def _question(trace: Trace) -> str:
    """The task's question: the text of the last user message the rollout started from."""
    users = [m for m in trace.prompt if m.role == "user"] or [m for m in trace.task.initial_messages()
                                                               if m.role == "user"]
    return users[-1].text if users else ""
