"""OpenEnv Task API of our OpenEnv server: the served taskset's tasks listed the way OpenEnv's dataset-backed
environments list theirs (`GET /list_environments`, `GET /{env}/splits`, `POST /{env}/num_tasks`, `/tasks`, `/task`,
`/task_range`), one split (`SPLIT`) holding every task in order, each a reset's `{"split": SPLIT, "index": i}`.

The environment's name is the taskset id with anything but letters, digits, `-` and `_` made `-`. An endless
taskset lists no tasks (501, as OpenEnv answers for an environment without the API); a split or index it does not
have is 400, an unknown environment 404. A range is at most `MAX_RANGE` tasks."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tracegym.core.task_data import TaskData

SPLIT = "train"
"""The one split: the taskset's tasks, in order."""
MAX_RANGE = 4096
"""Most tasks one `tasks` or `task_range` answer holds."""

Body = Callable[[Request], Awaitable[Any]]
Guard = Callable[[Callable[[Request], Any]], Callable[[Request], Awaitable[Any]]]


def environment_name(taskset_id: str) -> str:
    """The taskset's name in the Task API's paths."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", taskset_id)


class TaskListing:
    """The routes of one taskset's Task API over its rows (None: endless), behind the server's `guard` (its auth
    and body limits), reading bodies with `body`."""

    def __init__(self, taskset_id: str, rows: list[TaskData] | None, guard: Guard, body: Body) -> None:
        self.name, self.rows, self._body = environment_name(taskset_id), rows, body
        self.routes = [
            Route("/list_environments", guard(lambda _: JSONResponse([self.name]))),
            Route("/{env}/splits", guard(self._splits)),
            Route("/{env}/num_tasks", guard(self._num_tasks), methods=["POST"]),
            Route("/{env}/tasks", guard(self._tasks), methods=["POST"]),
            Route("/{env}/task", guard(self._task), methods=["POST"]),
            Route("/{env}/task_range", guard(self._task_range), methods=["POST"]),
        ]

    async def _splits(self, request: Request) -> JSONResponse:
        return self._refusal(request, None) or JSONResponse([{"name": SPLIT, "type": "train"}])

    async def _num_tasks(self, request: Request) -> JSONResponse:
        body = await self._read(request)
        return self._refusal(request, body) or JSONResponse({"num_tasks": len(self.rows or [])})

    async def _tasks(self, request: Request) -> JSONResponse:
        body = await self._read(request)
        return self._refusal(request, body) or JSONResponse({"tasks": self._range(0, MAX_RANGE),
                                                             "env_name": self.name})

    async def _task(self, request: Request) -> JSONResponse:
        body = await self._read(request)
        if refused := self._refusal(request, body):
            return refused
        index = body.get("index")
        if not isinstance(index, int) or not 0 <= index < len(self.rows or []):
            return JSONResponse({"detail": "Invalid task index"}, 400)
        return JSONResponse({"task": self._range(index, index + 1)[0]})

    async def _task_range(self, request: Request) -> JSONResponse:
        body = await self._read(request)
        if refused := self._refusal(request, body):
            return refused
        start, stop = body.get("start"), body.get("stop")
        if not all(v is None or isinstance(v, int) for v in (start, stop)):
            return JSONResponse({"detail": "start and stop are task indices"}, 400)
        first = 0 if start is None else start
        return JSONResponse({"tasks": self._range(first, min(len(self.rows or []) if stop is None else stop,
                                                             first + MAX_RANGE))})

    async def _read(self, request: Request) -> dict[str, Any]:
        body = await self._body(request)
        return body if isinstance(body, dict) else {}

    def _refusal(self, request: Request, body: dict[str, Any] | None) -> JSONResponse | None:
        """The answer to a request this listing cannot serve (another environment, an endless taskset, another
        split), else None."""
        if request.path_params["env"].lower() != self.name.lower():
            return JSONResponse({"detail": f"unknown environment {request.path_params['env']!r}"}, 404)
        if self.rows is None:
            return JSONResponse({"detail": "this taskset is endless: it lists no tasks"}, 501)
        if body is not None and body.get("split") != SPLIT:
            return JSONResponse({"detail": f"unknown split {body.get('split')!r} (splits: {SPLIT})"}, 400)
        return None

    def _range(self, start: int, stop: int) -> list[dict[str, Any]]:
        return [row.model_dump(mode="json") for row in (self.rows or [])[max(start, 0):max(stop, 0)]]
