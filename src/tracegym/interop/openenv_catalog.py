"""OpenEnv catalog: what an OpenEnv server offers, learned over HTTP before any session is opened.

Its action schema (`GET /schema`), its MCP tools (`tools/list` on `POST /mcp`, which openenv's `create_app` and our
server answer without taking a session) and, where the server says it, how many sessions it holds at once
(`max_sessions` in `GET /health`; otherwise learned from the first CAPACITY_REACHED frame). Asked once per
taskset, so the tools are known before setup: adapters that need them up front (TRL's `environment_factory`)
see them, and a server that cannot list them is refused by name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, Literal

import httpx

from tracegym.core.errors import ErrorKind, InfrastructureError, TracegymError
from tracegym.interop.openenv_connection import OpenEnvConnection

log = logging.getLogger(__name__)

_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                                "object": dict}


@dataclasses.dataclass(frozen=True)
class Offer:
    """What one OpenEnv server offers, as it said before any session."""

    action_schema: dict[str, Any]
    """Its action's JSON schema (`GET /schema`, `action`)."""
    mcp_tools: list[dict[str, Any]] | None
    """Its MCP tools (`tools/list`); [] for an environment without MCP; None when it lists them only in a session
    (no `POST /mcp`)."""
    capacity: int | None
    """The sessions it holds at once, where its `/health` says (`max_sessions`); None otherwise."""

    @property
    def through_step(self) -> bool:
        """MCP tools are called as steps (a CallToolAction: each call gives a reward and `done`)."""
        return "tool_name" in self.action_schema.get("properties", {})


def http_url(url: str) -> str:
    """The server's HTTP base of a ws:// (or http://) URL."""
    return url.replace("ws://", "http://", 1).replace("wss://", "https://", 1).rstrip("/")


def read_offer(url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> Offer:
    """Ask the server what it offers; an InfrastructureError naming it and the request that failed."""
    base = http_url(url)
    with httpx.Client(timeout=timeout, headers=headers) as client:
        try:
            health = client.get(f"{base}/health")
            health.raise_for_status()
        except httpx.HTTPError as exc:
            raise InfrastructureError(f"OpenEnv server {url} does not answer (GET /health: "
                                      f"{exc or type(exc).__name__}): is it running there?") from None
        schema = _json(client, "GET", f"{base}/schema", url)
        tools = _listed_tools(client, base, url)
    said = _or_none(health)
    capacity = said.get("max_sessions") if isinstance(said, dict) else None
    action = schema.get("action") if isinstance(schema, dict) else None
    return Offer(action_schema=action if isinstance(action, dict) else {}, mcp_tools=tools,
                 capacity=capacity if isinstance(capacity, int) and capacity > 0 else None)


def _or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _json(client: httpx.Client, method: str, address: str, url: str, **request: Any) -> Any:
    try:
        response = client.request(method, address, **request)
        response.raise_for_status()
        return response.json()
    except (httpx.HTTPError, ValueError) as exc:
        path = address.removeprefix(http_url(url))
        raise InfrastructureError(f"OpenEnv server {url}: {method} {path} failed "
                                  f"({exc or type(exc).__name__})") from None


def _listed_tools(client: httpx.Client, base: str, url: str) -> list[dict[str, Any]] | None:
    """The MCP tools `POST /mcp` lists; [] when the server answers that it has none (no MCP environment); None
    when it has no such endpoint."""
    try:
        response = client.post(f"{base}/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 1})
    except httpx.HTTPError as exc:
        raise InfrastructureError(f"OpenEnv server {url}: POST /mcp failed ({exc or type(exc).__name__})") from None
    if response.status_code in (404, 405):
        return None
    try:
        reply = response.json()
    except ValueError:
        return None
    result = reply.get("result") if isinstance(reply, dict) else None
    tools = result.get("tools") if isinstance(result, dict) else None
    return [t for t in tools if isinstance(t, dict) and t.get("name")] if isinstance(tools, list) else []


class Catalog:
    """One taskset's view of its server: the Offer, asked once (by whichever thread or task comes first), and the
    capacity, also learned from a CAPACITY_REACHED frame (noted once). A server without `POST /mcp` whose actions
    are tool calls has its tools listed in one short session (`session()` makes it), before any rollout."""

    def __init__(self, url: str, headers: Callable[[], dict[str, str] | None],
                 session: Callable[[], OpenEnvConnection]) -> None:
        self.url, self._headers, self._session = url, headers, session
        self._offer: Offer | None = None
        self._lock = threading.Lock()
        self.capacity: int | None = None
        """The sessions the server holds at once, once known."""
        self.held = 0
        """Sessions this taskset's rollouts hold now (one each, from setup to cleanup; all on one event loop)."""

    def offer(self) -> Offer:
        """The server's Offer (asked on first use; an InfrastructureError, or the session's error, when it cannot
        be read)."""
        with self._lock:
            if self._offer is None:
                offer = read_offer(self.url, self._headers())
                if offer.mcp_tools is None:
                    listed = self._list_in_session() if offer.through_step else []
                    offer = dataclasses.replace(offer, mcp_tools=listed)
                self._offer = offer
                self.capacity = self.capacity or offer.capacity
            return self._offer

    def _list_in_session(self) -> list[dict[str, Any]]:
        """`tools/list` in a session of its own, on a loop of its own (the caller may be inside one)."""
        async def listed() -> list[dict[str, Any]]:
            connection = self._session()
            try:
                await connection.open()
                return [t for t in (await connection.mcp("tools/list") or {}).get("tools", []) if t.get("name")]
            finally:
                await connection.close()
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            return thread.submit(asyncio.run, listed()).result()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (a TRL environment class carries its taskset): all but the lock and the sessions held here."""
        return {**vars(self), "_lock": None, "held": 0}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state, _lock=threading.Lock())

    def known(self) -> Offer | None:
        """The Offer if it was asked already (no I/O)."""
        return self._offer

    def learned_capacity(self, max_sessions: int) -> None:
        """A CAPACITY_REACHED frame said the server holds `max_sessions`: noted once, as it bounds the rollouts that
        run at once whatever `-c` says."""
        if self.capacity != max_sessions:
            self.capacity = max_sessions
            log.warning("OpenEnv server %s holds at most %d sessions at once: rollouts beyond %d wait for a free one "
                        "(run with -c %d, or give the server more: max_concurrent_envs)", self.url, max_sessions,
                        max_sessions, max_sessions)


    def full_of_our_own(self, refused: TracegymError) -> TracegymError:
        """A session refused while this taskset's own rollouts hold every one the server has, said so: waiting
        cannot help where those rollouts wait for this one (TRL resets a whole generation batch before it
        generates)."""
        if refused.kind != ErrorKind.INFRASTRUCTURE or self.capacity is None or self.held < self.capacity:
            return refused
        return InfrastructureError(
            f"{refused}: this taskset's own rollouts hold all {self.capacity} of its sessions; rollouts that run at "
            "once need a session each (under TRL, every rollout of a generation batch): give the server more "
            "(max_concurrent_envs) or run fewer at once")


def remote_function(name: str, description: str, parameters: dict[str, Any],
                    call: Callable[..., Any]) -> Callable[..., Any]:
    """An async function calling `call(**arguments)` whose signature, hints and Google-style docstring follow the
    tool's JSON schema, so what reads a function (transformers' `get_json_schema`, hence TRL) sees the remote tool.
    Parameters whose names are not Python identifiers keep the plain `**arguments` signature."""

    async def tool(**arguments: Any) -> Any:
        return await call(**arguments)

    properties: dict[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    tool.__name__ = tool.__qualname__ = name
    args = [f"    {key}: {_described(key, schema)}" for key, schema in properties.items()]
    tool.__doc__ = (description or f"The environment's tool {name}.").strip() + (
        "\n\nArgs:\n" + "\n".join(args) if args else "")
    if not all(key.isidentifier() for key in properties):
        return tool
    hints = {key: _hint(schema) for key, schema in properties.items()}
    signature = inspect.Signature([
        inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, annotation=hints[key],
                          default=inspect.Parameter.empty if key in required else schema.get("default"))
        for key, schema in sorted(properties.items(), key=lambda item: item[0] not in required)])
    vars(tool).update(__signature__=signature)
    tool.__annotations__ = hints
    return tool


def _described(key: str, schema: Any) -> str:
    text = schema.get("description") or schema.get("title") if isinstance(schema, dict) else None
    return " ".join(str(text or key).split())


def _hint(schema: Any) -> Any:
    """A Python hint for a JSON schema: its type, a Literal of its enum, a list of its items' hint, or Any."""
    if not isinstance(schema, dict):
        return Any
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return Literal[tuple(schema["enum"])]
    options = [s for s in schema.get("anyOf") or () if isinstance(s, dict) and s.get("type") != "null"]
    if len(options) == 1:
        return _hint(options[0]) | None
    kind = _JSON_TYPES.get(str(schema.get("type")))
    if kind is list and isinstance(schema.get("items"), dict):
        return list[_hint(schema["items"])]  # type: ignore[misc]
    return kind or Any
