"""A TRL-docs-style environment class wrapping an OpenEnv client (openenv's own `GenericEnvClient`), as every one of
TRL's OpenEnv examples does: one client per instance, made once in `__init__`, reset for each rollout. The server's
URL comes from the environment (`GUESS_URL`), as TRL's examples read `ENV_URL`."""

import os

from openenv.core.generic_client import GenericEnvClient

GUESS_URL = os.environ.get("GUESS_URL", "ws://127.0.0.1:8000")


class GuessToolEnv:
    """Guess a number from 1 to 100; the server says higher or lower."""

    def __init__(self):
        self.client = GenericEnvClient(base_url=GUESS_URL)
        self.reward = 0.0
        self.done = False

    def reset(self, **kwargs) -> str:
        result = self.client.reset(seed=kwargs.get("seed"))
        self.reward, self.done = 0.0, False
        return " " + result.observation["feedback"]

    def guess(self, number: int) -> str:
        """Guess the hidden number.

        Args:
            number: Your guess, from 1 to 100.

        Returns:
            higher, lower or correct.
        """
        if self.done:
            raise ValueError("The game is over.")
        result = self.client.step({"guess": number})
        self.reward, self.done = float(result.reward or 0.0), bool(result.done)
        return result.observation["feedback"]

    def get_reward(self) -> float:
        return self.reward
