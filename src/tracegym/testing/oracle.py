"""Oracle: an OpenAI-compatible server that answers each task of a taskset with its reference answer (a teacher
that is always right, for SFT runs and their tests: real HTTP, any chat client).

    python -m tracegym.testing.oracle --taskset reverse-text --options '{"seed": 0}' --port 8011

It is a `FakeOpenAIServer` whose rule looks the request's opening messages (system prompt and prompt) up among
the tasks it loaded (the taskset with each `--options` given; a finite taskset, or the first `--max-tasks` rows
of an endless one) and replies with that task's `answer` as text. A conversation it does not know (another
seed, a later turn of a multi-turn task) gets HTTP 404 naming the taskset, so a mistaken setup fails loudly
instead of training on blank replies.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tracegym.core.errors import ModelError, TracegymError, UsageError
from tracegym.core.messages import ImagePart, Message
from tracegym.envs.registry import load_taskset
from tracegym.models.client import ModelRequest
from tracegym.models.image_prompt import image_bytes, image_hash, message_images
from tracegym.testing.fake_server import FakeOpenAIServer
from tracegym.testing.script import Entry, Fail

MAX_TASKS = 100_000
"""Rows read from an endless taskset by default."""


Key = tuple[tuple[str, str, tuple[str, ...]], ...]


def conversation_key(messages: Sequence[Message]) -> Key:
    """The messages as (role, text, images) triples: how a request is matched to a task. An image is its bytes'
    SHA-256 where its URL is a data URI (a task's picture and the one a client sends are then the same), else its
    URL."""
    return tuple((m.role, m.text, tuple(image_identity(p) for p in message_images([m]))) for m in messages)


def image_identity(part: ImagePart) -> str:
    try:
        return image_hash(image_bytes(part))
    except ModelError:  # not inline: the URL is all there is to compare
        return part.image_url.get("url", "")


def reference_answers(taskset_id: str, options: Iterable[Mapping[str, Any]] = ({},),
                      max_tasks: int = MAX_TASKS) -> dict[Key, str]:
    """Each task's opening messages -> its reference answer as text, over the taskset built with each options; a
    UsageError where two tasks open alike but have different answers (the oracle could not tell which is asked)."""
    answers: dict[Key, str] = {}
    for option_set in options:
        taskset = load_taskset(taskset_id, dict(option_set))
        for data in itertools.islice(taskset, max_tasks):
            key, answer = conversation_key(data.initial_messages()), str(data.answer)
            if answers.setdefault(key, answer) != answer:
                raise UsageError(f"taskset {taskset_id!r}: two tasks open with the same messages but have different "
                                 f"answers ({answers[key]!r}, {answer!r}), so the oracle cannot tell which is asked")
    return answers


def oracle_server(taskset_id: str, options: Iterable[Mapping[str, Any]] = ({},), *, port: int = 0,
                  model: str = "oracle", max_tasks: int = MAX_TASKS) -> FakeOpenAIServer:
    """The oracle for `taskset_id` (not started: `with oracle_server(...) as server:`)."""
    answers = reference_answers(taskset_id, options, max_tasks)

    def answer(request: ModelRequest) -> Entry:
        found = answers.get(conversation_key(request.messages))
        return found if found is not None else Fail(404, f"the oracle knows no such task of {taskset_id!r}")

    return FakeOpenAIServer(rule=answer, model=model, port=port, token_fields=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracegym.testing.oracle",
                                     description="Serve a taskset's reference answers as an OpenAI-compatible model.")
    parser.add_argument("--taskset", required=True, help="taskset id, e.g. reverse-text")
    parser.add_argument("--options", action="append", default=[], metavar="JSON",
                        help='taskset options as a JSON object (repeat for several, e.g. two seeds); default: {}')
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--model", default="oracle", help="the model name it serves")
    parser.add_argument("--max-tasks", type=int, default=MAX_TASKS, help="rows read from each (endless) taskset")
    args = parser.parse_args(argv)
    try:
        options = [json.loads(o) for o in args.options] or [{}]
    except json.JSONDecodeError as exc:
        print(f"--options: not JSON: {exc}", file=sys.stderr)
        return 2
    try:
        server = oracle_server(args.taskset, options, port=args.port, model=args.model, max_tasks=args.max_tasks)
    except TracegymError as exc:
        print(f"--taskset / --options: {exc}", file=sys.stderr)
        return 2
    with server:
        print(f"oracle for {args.taskset}: {server.base_url} (model {args.model!r})", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
