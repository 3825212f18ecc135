"""OpenEnv answers: what a session says to each frame its client sends (reset, step, state, close, MCP), wherever
the session lives (the server's process, or a worker process of `openenv_worker`); no I/O of its own."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from openenv.core.env_server.mcp_types import (
    CallToolAction,
    JsonRpcErrorCode,
    JsonRpcRequest,
    ListToolsAction,
    WSMCPMessage,
)
from openenv.core.env_server.types import (
    WSCloseMessage,
    WSErrorCode,
    WSResetMessage,
    WSStateMessage,
    WSStepMessage,
)
from pydantic import ValidationError

from tracegym.core.errors import UsageError
from tracegym.interop.openenv_protocol import (
    ResetChoice,
    TasksetAction,
    TasksetObservation,
    error_frame,
    loads,
    mcp_content,
    mcp_tools,
    step_result,
)
from tracegym.interop.openenv_session import SessionError, TaskPicker, TasksetSession

Reply = tuple[dict[str, Any] | None, bool]
"""A WebSocket message's answer (None: none) and whether the session goes on."""


class SessionAnswers:
    """Answers the frames of the sessions of one taskset (`picker`); a frame over `max_frame_bytes` is refused."""

    def __init__(self, picker: TaskPicker, max_frame_bytes: int) -> None:
        self.picker, self.max_frame_bytes = picker, max_frame_bytes
        self._handlers: dict[str, Callable[[TasksetSession, dict[str, Any]], Awaitable[Reply]]] = {
            "reset": self._reset, "step": self._step, "state": self._state, "close": self._close, "mcp": self._mcp}

    def oversized(self, frame: str | bytes) -> dict[str, Any] | None:
        """The VALIDATION_ERROR frame refusing a frame over the limit; None for one within it."""
        limit = self.max_frame_bytes
        size = len(frame) if isinstance(frame, bytes) or 4 * len(frame) <= limit else len(frame.encode())
        if size <= limit:  # (a text frame that short cannot be over, however it encodes)
            return None
        return error_frame(WSErrorCode.VALIDATION_ERROR, f"frame of {size} bytes is over this server's limit of "
                           f"{limit} bytes")

    async def answer(self, session: TasksetSession, frame: str | bytes) -> Reply:
        """The answer to one frame; bad input is answered with an error frame and the session goes on."""
        refusal = self.oversized(frame)
        if refusal is not None:
            return refusal, True
        try:
            message = loads(frame)
        except (ValueError, UnicodeDecodeError) as exc:
            return error_frame(WSErrorCode.INVALID_JSON, f"Invalid JSON: {exc}"), True
        if not isinstance(message, dict):
            return error_frame(WSErrorCode.VALIDATION_ERROR, "a message is a JSON object with a `type`"), True
        kind = message.get("type")
        handler = self._handlers.get(kind) if isinstance(kind, str) else None
        if handler is None:
            return error_frame(WSErrorCode.UNKNOWN_TYPE, f"Unknown message type: {message.get('type')!r} (known: "
                               f"{', '.join(self._handlers)})"), True
        try:
            return await handler(session, message)
        except ValidationError as exc:
            return error_frame(WSErrorCode.VALIDATION_ERROR, "Invalid message",
                               errors=json.loads(exc.json(include_url=False, include_context=False))), True
        except (SessionError, UsageError) as exc:
            return error_frame(WSErrorCode.EXECUTION_ERROR, str(exc)), True
    async def _reset(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        choice = ResetChoice.model_validate(WSResetMessage.model_validate(message).data)
        return {"type": "observation", "data": step_result(await session.reset(choice))}, True

    async def _step(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        data = message.get("data")  # WSStepMessage's checks, without building it, unless it would refuse the frame
        if not isinstance(data, dict) or len(message) != 2:
            data = WSStepMessage.model_validate(message).data
        if data.get("type") in ("call_tool", "list_tools"):
            return {"type": "observation", "data": await self._mcp_step(session, data)}, True
        action = TasksetAction.model_validate(data)
        return {"type": "observation", "data": step_result(await session.step(action))}, True

    async def _mcp_step(self, session: TasksetSession, data: dict[str, Any]) -> dict[str, Any]:
        """An MCP-style step (openenv's `CallToolAction` / `ListToolsAction`, as its MCPToolClient's `step` sends
        them), answered as openenv's servers answer one: a CallToolObservation (`tool_name`, `result`, `error`) with
        `done` and `reward` beside it (the scores in `metadata` once done), or a ListToolsObservation."""
        if data["type"] == "list_tools":
            ListToolsAction.model_validate(data)
            return {"observation": {"tools": session.tools(), "metadata": {}}, "reward": None, "done": False}
        call = CallToolAction.model_validate(data)
        observation, content, failed = await session.call_tool(call.tool_name, call.arguments)
        try:
            result = tool_call_result(observation, mcp_content(content), failed)
        except ValueError as exc:
            raise SessionError(f"tool {call.tool_name!r}'s result: {exc}") from None
        metadata = result.get("metadata", {})
        return {"observation": {"tool_name": call.tool_name, "result": result, "error": None, "metadata": metadata},
                "reward": observation.reward, "done": observation.done, **({"metadata": metadata} if metadata else {})}

    async def _state(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        WSStateMessage.model_validate(message)
        return {"type": "state", "data": session.state().model_dump()}, True

    async def _close(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        WSCloseMessage.model_validate(message)
        return None, False

    async def _mcp(self, session: TasksetSession, message: dict[str, Any]) -> Reply:
        request = JsonRpcRequest.model_validate(WSMCPMessage.model_validate(message).data)
        return {"type": "mcp", "data": await self.rpc(request, session)}, True

    async def rpc(self, request: JsonRpcRequest, session: TasksetSession | None) -> dict[str, Any]:
        """One MCP JSON-RPC call: `tools/list`, or `tools/call` as one turn of the session's rollout."""
        if request.method == "tools/list":
            tools = session.tools() if session is not None else mcp_tools(self.picker.first_tools)
            return rpc_result(request, {"tools": tools})
        if request.method != "tools/call":
            return rpc_error(request, JsonRpcErrorCode.METHOD_NOT_FOUND, f"Method not found: {request.method}")
        name, arguments = request.params.get("name"), request.params.get("arguments") or {}
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return rpc_error(request, JsonRpcErrorCode.INVALID_PARAMS, "tools/call takes `name` (a string) and "
                             "`arguments` (an object)")
        if session is None:
            return rpc_error(request, JsonRpcErrorCode.INVALID_REQUEST, "tools/call needs a session: open a "
                             "WebSocket at /ws and reset it (or give the `session_id` of openenv/session/create)")
        try:
            observation, content, failed = await session.call_tool(name, arguments)
            blocks = mcp_content(content)
        except SessionError as exc:
            return rpc_error(request, JsonRpcErrorCode.INVALID_REQUEST, str(exc))
        except ValueError as exc:
            return rpc_error(request, JsonRpcErrorCode.INTERNAL_ERROR, f"tool {name!r}'s result: {exc}")
        return rpc_result(request, tool_call_result(observation, blocks, failed))


def tool_call_result(observation: TasksetObservation, blocks: list[dict[str, Any]],
                     failed: bool) -> dict[str, Any]:
    """A `tools/call` result: MCP's (`content`, `isError`), `data` (what OpenEnv's MCPToolClient.call_tool returns,
    as from a FastMCP environment: the text, or the blocks where they hold images), and, as OpenEnv's own servers
    answer an MCP-style step (a CallToolObservation), `done` and `reward`, with the scores in `metadata` once the
    turn ended the episode, so the client knows it is over."""
    texts = [b["text"] for b in blocks if b["type"] == "text"]
    data = "".join(texts) if len(texts) == len(blocks) else blocks
    result = {"content": blocks, "isError": failed, "data": data, "done": observation.done,
              "reward": observation.reward}
    if observation.done:
        result["metadata"] = {**observation.metadata, "rewards": observation.rewards, "metrics": observation.metrics,
                              "stop_reason": observation.stop_reason}
    return result


def rpc_result(request: JsonRpcRequest, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request.id, "result": result}


def rpc_error(request: JsonRpcRequest, code: JsonRpcErrorCode, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request.id, "error": {"code": code.value, "message": message}}
