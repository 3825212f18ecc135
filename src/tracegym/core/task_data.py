"""TaskData: one immutable, serializable task row (prompt, reference answer, task-specific fields)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from tracegym.core.messages import Message, system, user


class TaskData(BaseModel):
    """One task row. Subclass it to declare task-specific fields; unknown fields are kept as extras,
    so a row written by a subclass reads back losslessly as plain TaskData (and vice versa)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    prompt: str | list[Message]
    """The user prompt as text, or the opening messages."""
    system_prompt: str | None = None
    """A system prompt put before the prompt."""
    answer: Any = None
    """The reference answer, when the task has one."""
    id: str | None = None
    """The task's key: given by the taskset, or set to the row's position when the taskset loads it."""

    @property
    def key(self) -> str:
        """The stable task key: the row's id (a taskset always sets one: given, or the row's position); a row
        built by hand without an id falls back to a hash of its content (identical rows then share it)."""
        if self.id is not None:
            return self.id
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def __eq__(self, other: object) -> bool:
        """Rows are equal when their JSON is: a subclass's row equals the plain TaskData it reads back as."""
        if not isinstance(other, TaskData):
            return NotImplemented
        return self.model_dump(mode="json") == other.model_dump(mode="json")

    def __hash__(self) -> int:
        return hash(self.key)

    def fields(self) -> dict[str, Any]:
        """Every field of the row (declared and extra) as plain values."""
        return self.model_dump()

    def initial_messages(self) -> list[Message]:
        """The messages a rollout starts from: the system prompt, then the prompt."""
        head = [system(self.system_prompt)] if self.system_prompt else []
        if isinstance(self.prompt, str):
            return [*head, user(self.prompt)]
        return [*head, *self.prompt]
