"""Policy version: how a vLLM server tells each response which policy version served it.

During RL the trainer replaces the served weights while rollouts are in flight, so only the server knows which
weights answered a call. vLLM runs with this module's middleware (`--middleware
tracegym.models.policy_version.stamp`, see `VLLMServerConfig.report_policy_version`); after each publish the
weight sync posts the new version to `ROUTE`, and every response carries the version current when its request
*arrived* in the `HEADER` header. A reload during a long generation means some of its tokens came from newer
weights; stamping the arrival version errs toward older, which is the safe side for dropping stale samples.
The transport reads the header (`read`) with each reply, the model clients put it on
`ModelResponse.policy_version`, and the rollout stamps the node.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

HEADER = "x-tracegym-policy-version"
ROUTE = "/tracegym/policy_version"
MIDDLEWARE = f"{__name__}.stamp"
"""What `vllm serve --middleware` takes to load `stamp`."""

_served: int | None = None
"""The version the server in this process serves now (None until the first publish: the base model)."""


async def stamp(request: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
    """Starlette HTTP middleware: answer `POST ROUTE {"version": N}`, and put the version served when each
    other request arrived into its response's `HEADER`."""
    global _served
    if request.url.path == ROUTE and request.method == "POST":
        from starlette.responses import JSONResponse  # only inside the vLLM server, which has starlette

        try:
            _served = int(json.loads(await request.body())["version"])
        except (ValueError, KeyError, TypeError) as exc:
            return JSONResponse({"error": f"expected {{'version': int}}: {exc}"}, status_code=400)
        return JSONResponse({"version": _served})
    version = _served
    response = await call_next(request)
    if version is not None:
        response.headers[HEADER] = str(version)
    return response


def read(headers: Mapping[str, str]) -> int | None:
    """The policy version a response's headers report, or None when the server does not report one."""
    value = headers.get(HEADER)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
