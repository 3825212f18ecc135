"""Reference OpenEnv environments for the interop tests, written with the `openenv` package's own base classes and
served by its own `create_app`: an MCP echo environment (its tools via `tools/list`, called through steps) and a
number-guessing game with a typed action schema (no MCP)."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from tracegym.interop.openenv_server import serving
from tracegym.testing import reply, tool_call

GUESSES = 7
"""Enough for a binary search over 1..100."""


class GuessAction(Action):
    """Guess the hidden number."""

    guess: int = Field(ge=1, le=100, description="Your guess, from 1 to 100.")


class GuessObservation(Observation):
    feedback: str = ""
    guesses_left: int = GUESSES


def target_of(seed: int | None) -> int:
    """The number a reset with this seed hides."""
    return random.Random(seed).randint(1, 100)


class GuessEnvironment(Environment):
    """Guess a number from 1 to 100 in 7 tries; "higher"/"lower" after each; reward 1 for finding it."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)
        self.target: int | None = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self.target = target_of(seed)
        return GuessObservation(feedback="I am thinking of a number from 1 to 100.")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        assert isinstance(action, GuessAction)
        if self.target is None:
            raise RuntimeError("reset first")
        self._state.step_count += 1
        left = GUESSES - self._state.step_count
        if action.guess == self.target:
            return GuessObservation(feedback="correct", guesses_left=left, reward=1.0, done=True)
        feedback = "higher" if action.guess < self.target else "lower"
        return GuessObservation(feedback=feedback, guesses_left=left, reward=0.0, done=left == 0)

    @property
    def state(self) -> State:
        return self._state


LISTED = {"train": [11, 22, 33], "test": [44, 55]}
"""The listed guessing game's tasks: the hidden number of each, by split."""


class ListedGuessEnvironment(GuessEnvironment):
    """The guessing game backed by a dataset: OpenEnv's Task API lists its splits and tasks, and a reset picks one
    by split and index."""

    def list_splits(self) -> list[str]:
        return list(LISTED)

    def num_tasks(self, split: str) -> int:
        return len(LISTED[split])

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        return [{"id": f"{split}-{i}", "target": t} for i, t in enumerate(LISTED[split])][start:stop]

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        observation = super().reset(seed, episode_id)
        if "split" in kwargs:
            self.target = LISTED[kwargs["split"]][kwargs["index"]]
        return observation


class EchoEnvironment(MCPEnvironment):
    """OpenEnv's echo environment in miniature: an MCP tool that echoes; reward 0.1 per character echoed."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("echo")

        @mcp.tool()
        def echo_message(message: str) -> str:
            """Echo a message back."""
            return message

        super().__init__(mcp)
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self._state = State(episode_id=episode_id, step_count=0)
        return Observation(metadata={"ready": True})

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise ValueError(f"the echo environment takes tool calls, not {type(action).__name__}")

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and isinstance(observation, CallToolObservation):
            observation.reward = 0.1 * len(str(action.arguments.get("message", "")))
        return observation

    @property
    def state(self) -> State:
        return self._state


@contextlib.contextmanager
def guess_server(max_concurrent_envs: int = 8) -> Iterator[str]:
    """The guessing game on openenv's own server; yields its ws:// URL."""
    with serving(create_app(GuessEnvironment, GuessAction, GuessObservation,
                            max_concurrent_envs=max_concurrent_envs)) as url:
        yield url


@contextlib.contextmanager
def listed_guess_server() -> Iterator[str]:
    """The guessing game with a Task API (splits train and test) on openenv's own server; yields its ws:// URL."""
    with serving(create_app(ListedGuessEnvironment, GuessAction, GuessObservation, env_name="guess",
                            max_concurrent_envs=4)) as url:
        yield url


@contextlib.contextmanager
def echo_server(max_concurrent_envs: int = 8) -> Iterator[str]:
    """The MCP echo environment on openenv's own server; yields its ws:// URL."""
    with serving(create_app(EchoEnvironment, CallToolAction, CallToolObservation,
                            max_concurrent_envs=max_concurrent_envs)) as url:
        yield url


def bisect(request):
    """A model that plays the guessing game by bisection, reading the feedback of its earlier guesses."""
    low, high, guess = 1, 100, None
    for message in request.messages:
        if message.role == "assistant" and message.tool_calls:
            guess = json.loads(message.tool_calls[0].arguments)["guess"]
        if message.role == "tool" and guess is not None:
            feedback = json.loads(message.text)["feedback"]
            low, high = (guess + 1, high) if feedback == "higher" else (low, guess - 1) if feedback == "lower" else (
                low, high)
    if request.messages[-1].role == "tool" and "correct" in request.messages[-1].text:
        return "I found it."
    return reply(None, tool_call("act", {"guess": (low + high) // 2}))
