"""OpenEnv task splits: a dataset-backed OpenEnv environment's tasks, read from its server's Task API
(`GET /list_environments`, `GET /{env}/splits`, `POST /{env}/num_tasks`, `POST /{env}/task_range`), so an
`openenv:` taskset with `split` set runs those tasks (each reset with the split and the task's index) instead of
seeded resets."""

from __future__ import annotations

from typing import Any

import httpx

from tracegym.core.errors import UsageError
from tracegym.interop.openenv_catalog import http_url

RANGE_CHUNK = 512
"""Task specs asked for in one `task_range` request."""


def read_split(url: str, split: str, limit: int | None, headers: dict[str, str] | None = None,
               timeout: float = 10.0) -> list[Any]:
    """The task specs of `split` on the server at `url` (its first `limit`; None: all), in index order; a
    UsageError naming the server and what failed: no Task API, an unknown split, an unreadable answer."""
    base = http_url(url)
    with httpx.Client(timeout=timeout, headers=headers) as client:
        env = _environment(client, base, url)
        count = _ask(client, "POST", f"{base}/{env}/num_tasks", url, split, json={"split": split}).get("num_tasks")
        if not isinstance(count, int) or count < 0:
            raise UsageError(f"OpenEnv server {url}: num_tasks of split {split!r} is not a count ({count!r})")
        wanted = count if limit is None else min(count, limit)
        specs: list[Any] = []
        while len(specs) < wanted:
            stop = min(wanted, len(specs) + RANGE_CHUNK)
            got = _ask(client, "POST", f"{base}/{env}/task_range", url, split,
                       json={"split": split, "start": len(specs), "stop": stop}).get("tasks")
            if not isinstance(got, list) or not got:
                raise UsageError(f"OpenEnv server {url}: task_range {len(specs)}:{stop} of split {split!r} gave "
                                 f"no tasks ({got!r})")
            specs += got[:stop - len(specs)]
    return specs


def _environment(client: httpx.Client, base: str, url: str) -> str:
    try:
        response = client.get(f"{base}/list_environments")
        names = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError) as exc:
        raise UsageError(f"OpenEnv server {url}: GET /list_environments failed ({exc or type(exc).__name__})") \
            from None
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise UsageError(f"OpenEnv server {url} has no Task API (GET /list_environments answered "
                         f"{response.status_code}): `split` needs an environment that lists its tasks")
    return names[0]


def _ask(client: httpx.Client, method: str, address: str, url: str, split: str, **request: Any) -> dict[str, Any]:
    try:
        response = client.request(method, address, **request)
    except httpx.HTTPError as exc:
        raise UsageError(f"OpenEnv server {url}: {method} {address.removeprefix(http_url(url))} failed "
                         f"({exc or type(exc).__name__})") from None
    if response.status_code == 501:
        raise UsageError(f"OpenEnv server {url} has no Task API (its environment lists no tasks): `split` needs "
                         "one that does")
    if response.status_code != 200:
        raise UsageError(f"OpenEnv server {url}: split {split!r} cannot be read ({response.status_code}: "
                         f"{_detail(response)}; its splits: {_splits(client, address, url)})")
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise UsageError(f"OpenEnv server {url}: {address.removeprefix(http_url(url))} answered no JSON object")
    return answer


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))[:200]
    except (ValueError, AttributeError):
        return response.text[:200]


def _splits(client: httpx.Client, address: str, url: str) -> str:
    """The server's split names, for an error (what it says, or `unknown`)."""
    try:
        listed = client.get(address.rsplit("/", 1)[0] + "/splits").json()
        return ", ".join(str(s.get("name", s)) if isinstance(s, dict) else str(s) for s in listed) or "none"
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        return "unknown"
