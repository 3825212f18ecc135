"""Harness choice: the agent program a command's config runs for every task of an env (prime-rl's per-env
`harness`), as plain data that crosses to the env server's workers; `harness()` builds the `ProgramHarness`.

>>> choice = HarnessChoice(command=["my-agent", "--task", "{prompt}"], env={"AGENT_KEY": "{api_key}"})
>>> choice.harness().command
['my-agent', '--task', '{prompt}']
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tracegym.core.errors import UsageError
from tracegym.envs.harness import ProgramHarness
from tracegym.runtimes.sandbox import Limits


class HarnessChoice(BaseModel):
    """An agent program to run for each rollout instead of tracegym's own turn loop (`envs.harness`), whatever
    harness the task class has: in the task's sandbox, its model calls through the interception proxy. A command's
    env-server section takes it as `harness` (`--env.harness.command '["my-agent", "{prompt}"]'`; prime-rl's per-env
    `harness`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    command: list[str] = Field(min_length=1)
    """The program and its arguments, each a template that may name `{prompt}`, `{model}`, `{workdir}` and
    `{task_key}` (the proxy's `{base_url}` and `{api_key}` only in `env`: never on a command line)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the program (templates, as `command`'s, plus `{base_url}` and `{api_key}`); it
    also gets `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`, `TRACEGYM_PROMPT` and `TRACEGYM_MESSAGES`."""
    setup: list[str] = Field(default_factory=list)
    """A command run in the working directory first (within the setup timeout); empty: none."""
    limits: Limits = Limits(wall_seconds=600.0)
    """The program's limits: `limits.wall_seconds` its time limit, 600 s (a `ProgramHarness`'s) when no `limits`
    key is given; once one is (`--env.harness.limits.memory-mb 512`), the others take `Limits`' own defaults (60 s
    wall): give `wall_seconds` with it. Network off unless `limits.network`."""

    @model_validator(mode="after")
    def _templates(self) -> HarnessChoice:
        """A template naming an unknown placeholder, or the proxy key on the command line, is refused here."""
        try:
            self.harness()
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        return self

    def harness(self) -> ProgramHarness:
        """The program harness this choice describes."""
        return ProgramHarness(command=self.command, env=self.env, setup=self.setup, limits=self.limits)
