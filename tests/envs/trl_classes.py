"""Fixtures: the server-free environment classes of TRL's docs, examples and tests, embedded verbatim (they are the
thing under test), each under a comment naming its source file in huggingface/trl; and one written independently.

TRL defines most of its test classes inside test functions; here each such class is returned by a function named
after its test, so classes that share a name (TRL's several `DummyEnvironment`s) keep it, and with it the reward
name TRL logs their `get_reward` under. Module-level names are the ones the CLI tests load by `file.py:Name`.
"""
# ruff: noqa: E501

import asyncio
import random

from PIL import Image

# --- tests/test_grpo_trainer.py -------------------------------------------------------------------------------------

reset_kwargs_seen = {"counter": [], "echo": []}
tool_calls_made = {"increment": [], "shout": []}


# tests/test_grpo_trainer.py::test_train_with_multiple_environments
class CounterEnvironment:
    def reset(self, **kwargs):
        reset_kwargs_seen["counter"].append(kwargs)
        return "Count."

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        tool_calls_made["increment"].append(step)
        return step


# tests/test_grpo_trainer.py::test_train_with_multiple_environments
class EchoEnvironment:
    def reset(self, **kwargs):
        reset_kwargs_seen["echo"].append(kwargs)
        return "Echo."

    def shout(self, text: str) -> str:
        """
        Shout the given text.

        Args:
            text: Text to shout.

        Returns:
            The text in upper case.
        """
        tool_calls_made["shout"].append(text)
        return text.upper()


MULTIPLE_ENVIRONMENTS = {"counter": CounterEnvironment, "echo": EchoEnvironment}
"""The test's `environment_factory={"counter": CounterEnvironment, "echo": EchoEnvironment}`."""


def test_train_with_unknown_environment_raises():
    # tests/test_grpo_trainer.py::test_train_with_unknown_environment_raises
    class CounterEnvironment:
        def reset(self, **kwargs): ...

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            return step

    return CounterEnvironment


# tests/test_grpo_trainer.py::test_train_with_environment_factory
class DummyEnvironment:
    def reset(self, **kwargs):
        self._counter = 0

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self._counter += step
        return self._counter


def test_train_with_environment_owned_reward():
    # tests/test_grpo_trainer.py::test_train_with_environment_owned_reward
    class DummyEnvironment:
        def reset(self, **kwargs):
            self._counter = 0

        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            self._counter += step
            return self._counter

        def get_reward(self) -> float:
            return float(self._counter)

    return DummyEnvironment


def test_environment_owned_reward_coexists_with_reward_funcs():
    # tests/test_grpo_trainer.py::test_environment_owned_reward_coexists_with_reward_funcs
    class DummyEnvironment:
        def reset(self, **kwargs):
            self._solved = False

        def guess(self, word: str) -> str:
            """
            Submit a guess.

            Args:
                word: The guessed word.

            Returns:
                Feedback about the guess.
            """
            return "nope"

        def get_reward(self) -> float:
            return 1.0 if self._solved else 0.0

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    return DummyEnvironment, format_reward


def test_environment_owned_reward_mixed_environments():
    # tests/test_grpo_trainer.py::test_environment_owned_reward_mixed_environments
    class ScoredEnvironment:  # owns its reward
        def reset(self, **kwargs): ...

        def act(self, x: int) -> int:
            """
            Act.

            Args:
                x: A value.

            Returns:
                The value.
            """
            return x

        def get_reward(self) -> float:
            return 1.0

    class PlainEnvironment:  # no `get_reward`; scored by `reward_funcs`
        def reset(self, **kwargs): ...

        def play(self, x: int) -> int:
            """
            Play.

            Args:
                x: A value.

            Returns:
                The value.
            """
            return x

    def format_reward(completions, **kwargs):
        return [0.0 for _ in completions]

    return ScoredEnvironment, PlainEnvironment, format_reward


def test_multiple_environments_without_dataset_raises():
    # tests/test_grpo_trainer.py::test_multiple_environments_without_dataset_raises (and its twin in
    # tests/experimental/test_async_grpo_trainer.py)
    class EnvA:
        def reset(self, **kwargs): ...

    class EnvB:
        def reset(self, **kwargs): ...

    return EnvA, EnvB


# tests/test_grpo_trainer.py::test_train_with_environment_owned_data (and test_environment_owned_data_requires_max_steps,
# and its twin in tests/experimental/test_async_grpo_trainer.py)
class GuessTheWordEnvironment:
    def reset(self, **kwargs):
        return "Guess the 5-letter word."  # the env owns the data and returns the prompt


# tests/test_grpo_trainer.py::test_train_with_environment_owned_data
def reward_len(completions, **kwargs):
    return [float(len(completion[-1]["content"])) for completion in completions]


def test_multiple_environments_expose_only_their_own_tools():
    # tests/experimental/test_async_grpo_trainer.py::TestAsyncRolloutWorkerEnvironments
    class CounterEnvironment:
        def reset(self, **kwargs): ...

        def increment(self, step: int) -> int:
            """Increment the counter.

            Args:
                step: Value to add.

            Returns:
                The updated value.
            """
            return step

    class EchoEnvironment:
        def reset(self, **kwargs): ...

        def shout(self, text: str) -> str:
            """Shout the text.

            Args:
                text: Text to shout.

            Returns:
                The text in upper case.
            """
            return text.upper()

    return CounterEnvironment, EchoEnvironment


# --- docs/source/grpo_trainer.md ------------------------------------------------------------------------------------


def docs_increment_env():
    # docs/source/grpo_trainer.md, "Environments": the environment owns the data and self-samples a target
    class IncrementEnv:
        # Reserved methods
        def reset(self, **kwargs) -> str | None:  # required; called at the start of each rollout
            self.counter = 0
            self.target = random.randint(1, 6)  # self-sample the task
            return f"Increment the counter by {self.target}."  # returned string becomes the prompt

        def get_reward(self) -> float:  # optional: the environment scores itself from its own state
            return float(self.counter == self.target)

        # Public methods (exposed as tools)
        def increment(self, step: int) -> int:
            """
            Increment the internal counter.

            Args:
                step: Value to add to the counter.

            Returns:
                The updated counter value.
            """
            self.counter += step
            return self.counter

    return IncrementEnv


def docs_increment_env_with_dataset():
    # docs/source/grpo_trainer.md, "Providing an external dataset (optional)"
    class IncrementEnv:
        def reset(self, target, **kwargs) -> None:  # the row's `target` column arrives as a keyword argument
            self.counter = 0
            self.target = target

        def get_reward(self) -> float:
            return float(self.counter == self.target)

        def increment(self, step: int) -> int:  # exposed as a tool (see the full docstring above)
            self.counter += step
            return self.counter

    return IncrementEnv


# docs/source/grpo_trainer.md, "Multiple environments"
class CodingEnv:
    def reset(self, **kwargs) -> str:
        n = random.randint(1, 20)
        return f"Compute the {n}th Fibonacci number."

    def run_code(self, code: str) -> str:  # exposed as a tool only for "coding" examples
        """Run the given Python code and return its stdout.

        Args:
            code: The Python source to execute.

        Returns:
            The captured standard output.
        """
        ...


# docs/source/grpo_trainer.md, "Multiple environments"
class GameEnv:
    def reset(self, **kwargs) -> str:
        return "Reach the goal tile."

    def move(self, action: str) -> str:  # exposed as a tool only for "game" examples
        """Apply an action to the game and return the new observation.

        Args:
            action: One of "up", "down", "left", "right".

        Returns:
            The observation after the move.
        """
        ...


DOCS_ENVIRONMENTS = {"coding": CodingEnv, "game": GameEnv}
"""The docs' `environment_factory={"coding": CodingEnv, "game": GameEnv}`."""


# --- examples/scripts/grpo_2048.py ----------------------------------------------------------------------------------

PROMPT = "Play 2048 on a 4x4 board. Use the tool `move` with one of: up, down, left, right. Maximize the score."


class Game2048Env:
    def reset(self, **kwargs) -> str:
        self.board = [[0] * 4 for _ in range(4)]
        self.score = 0.0
        self.done = False
        self._spawn()
        self._spawn()
        return f"score={self.score}\n{self._render()}\ndone={self.done}"

    def move(self, direction: str) -> str:
        """
        Play one move in 2048.

        Args:
            direction: One of "up", "down", "left", "right".

        Returns:
            Environment feedback after the move.
        """
        if self.done:
            raise ValueError("Game over.")
        moved, gained = self._apply_move(direction.strip().lower())
        if moved:
            self.score += gained
            self._spawn()
        self.done = not self._can_move()
        return f"score={self.score}\n{self._render()}\ndone={self.done}"

    def _spawn(self) -> None:
        empty = [(r, c) for r in range(4) for c in range(4) if self.board[r][c] == 0]
        if not empty:
            return
        r, c = random.choice(empty)
        self.board[r][c] = 4 if random.random() < 0.1 else 2

    @staticmethod
    def _merge_line(line: list[int]) -> tuple[list[int], int]:
        vals = [x for x in line if x]
        out = []
        gained = 0
        i = 0
        while i < len(vals):
            if i + 1 < len(vals) and vals[i] == vals[i + 1]:
                v = vals[i] * 2
                out.append(v)
                gained += v
                i += 2
            else:
                out.append(vals[i])
                i += 1
        out += [0] * (4 - len(out))
        return out, gained

    def _apply_move(self, direction: str) -> tuple[bool, int]:
        if direction not in {"up", "down", "left", "right"}:
            return False, 0

        before = [row[:] for row in self.board]
        gained_total = 0

        if direction in {"left", "right"}:
            for r in range(4):
                row = self.board[r][:]
                if direction == "right":
                    row.reverse()
                merged, gained = self._merge_line(row)
                if direction == "right":
                    merged.reverse()
                self.board[r] = merged
                gained_total += gained
        else:
            for c in range(4):
                col = [self.board[r][c] for r in range(4)]
                if direction == "down":
                    col.reverse()
                merged, gained = self._merge_line(col)
                if direction == "down":
                    merged.reverse()
                for r in range(4):
                    self.board[r][c] = merged[r]
                gained_total += gained

        moved = self.board != before
        return moved, gained_total

    def _can_move(self) -> bool:
        if any(0 in row for row in self.board):
            return True
        for r in range(4):
            for c in range(4):
                if r + 1 < 4 and self.board[r][c] == self.board[r + 1][c]:
                    return True
                if c + 1 < 4 and self.board[r][c] == self.board[r][c + 1]:
                    return True
        return False

    def _render(self) -> str:
        return "\n".join(" ".join(f"{v:3d}" for v in row) for row in self.board)


def reward_score(environments, **kwargs):
    return [env.score for env in environments]


# --- written independently for tracegym ------------------------------------------------------------------------------


class Darkroom:
    """A dark room with a lamp: the model switches the lamp on and photographs the room (an image result, as TRL's
    BrowserGym and CARLA examples return), then leaves, which ends the episode. Everything TRL allows at once: an
    async tool, a static-method tool, a class method and a property (neither a tool), an async `get_reward`, a
    `done` attribute, and tools that raise once the episode is over."""

    def __init__(self):
        self.lit = False
        self.photos = 0
        self.done = False

    def reset(self, room: str = "attic", **kwargs) -> list:
        self.room, self.lit, self.photos, self.done = room, False, 0, False
        return [{"type": "text", "text": f" You stand in the {room}."}]

    async def switch(self, on: bool) -> str:
        """
        Switch the lamp.

        Args:
            on: True to switch it on, False to switch it off.

        Returns:
            What the lamp does.
        """
        self._check()
        await asyncio.sleep(0)
        self.lit = on
        return "The lamp glows." if on else "Darkness."

    def photograph(self) -> list:
        """
        Take a photograph of the room.

        Returns:
            The photograph and a caption.
        """
        self._check()
        self.photos += 1
        shade = 255 if self.lit else 0
        return [{"type": "image", "image": Image.new("L", (4, 4), shade)}, {"type": "text", "text": "Click."}]

    def leave(self) -> str:
        """
        Leave the room, ending the episode.

        Returns:
            A farewell.
        """
        self._check()
        self.done = True
        return "You leave."

    @staticmethod
    def describe(room: str) -> str:
        """
        Describe a room without entering it.

        Args:
            room: The room's name (choices: ["attic", "cellar"])

        Returns:
            A description.
        """
        return f"The {room} is dark."

    @classmethod
    def build(cls, size: int) -> "Darkroom":
        return cls()

    @property
    def brightness(self) -> int:
        return 255 if self.lit else 0

    async def get_reward(self) -> float:
        return float(self.lit and self.photos > 0)

    def _check(self) -> None:
        if self.done:
            raise ValueError("Episode is done.")


def lit_photos(environments, completion_ids, trainer_state, log_metric, **kwargs):
    """A reward in every convention TRL documents: it reads the environments, the completion tokens, the trainer
    state, and logs a metric; rows of other environments are not its business (None)."""
    log_metric("completion_tokens", float(len(completion_ids[0])))
    return [float(env.photos) if isinstance(env, Darkroom) else None for env in environments]
