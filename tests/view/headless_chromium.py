"""Headless Chromium: Debian's `/usr/bin/chromium` started with a throwaway profile and driven over the Chrome DevTools
Protocol (aiohttp's WebSocket client), so the viewer's tests open real pages, read the DOM, hover, click and take
screenshots.

    async with Chromium.launch() as browser:
        page = await browser.page()
        await page.goto("http://127.0.0.1:8000/")
        await page.text("h1")
        await page.screenshot(Path("run.png"))

Every wait is bounded (a `TimeoutError` naming what it waited for), and the browser's whole process group is
killed on exit, whatever happened.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from process_group import stop_group

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_TIMEOUT = 60.0
"""Seconds for the browser to start and publish its DevTools port (a cold start on a busy 2-core machine)."""
CALL_TIMEOUT = 30.0
"""Seconds one DevTools command may take (a navigation's load counts as one)."""
WINDOW = (1280, 900)
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--disable-background-networking", "--mute-audio",
         "--disable-dev-shm-usage", "--hide-scrollbars", f"--window-size={WINDOW[0]},{WINDOW[1]}"]


class BrowserUnavailable(RuntimeError):
    """No Chromium to run here (tests skip with this reason)."""


class PageError(RuntimeError):
    """A page's script threw, a navigation failed, or an element was not found."""


def chromium_missing() -> str | None:
    """Why no browser test can run here, or None when Chromium is installed."""
    if not CHROMIUM.exists() or not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is not installed (Debian package `chromium`)"
    return None


class Chromium:
    """One headless browser process; `launch()` it as an async context manager, then open `page()`s."""

    def __init__(self, process: subprocess.Popen[bytes], profile: Path, port: int,
                 session: aiohttp.ClientSession) -> None:
        self.process = process
        self.profile = profile
        self.port = port
        self.session = session
        self.pages: list[Page] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def launch(cls) -> AsyncIterator[Chromium]:
        if (why := chromium_missing()) is not None:
            raise BrowserUnavailable(why)
        profile = Path(tempfile.mkdtemp(prefix="tracegym-chromium-"))
        log = (profile.parent / f"{profile.name}.log").open("wb")
        process = subprocess.Popen([str(CHROMIUM), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # its own process group: killed whole on exit
        session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT))
        try:
            port = await _devtools_port(profile, process, Path(log.name))
            browser = cls(process, profile, port, session)
            yield browser
            for page in browser.pages:
                await page.close()  # first, so no reader task is left waiting on a socket the kill cuts
        finally:
            await session.close()
            stop_group(process)  # renderers, zygotes and all
            log.close()
            shutil.rmtree(profile, ignore_errors=True)
            Path(log.name).unlink(missing_ok=True)

    async def page(self) -> Page:
        """A new tab, connected, with the events the tests read turned on."""
        async with self.session.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as response:
            target = await response.json()
        socket = await self.session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0,
                                               timeout=aiohttp.ClientWSTimeout(ws_close=2.0))
        page = Page(socket)
        page.reader = asyncio.create_task(page.read())
        for domain in ("Page", "Runtime", "Network"):
            await page.call(f"{domain}.enable")
        await page.call("Emulation.setDeviceMetricsOverride", width=WINDOW[0], height=WINDOW[1],
                        deviceScaleFactor=1, mobile=False)
        self.pages.append(page)
        return page


async def _devtools_port(profile: Path, process: subprocess.Popen[bytes], log: Path) -> int:
    """The port Chromium chose, from the `DevToolsActivePort` file it writes into its profile when ready."""
    marker = profile / "DevToolsActivePort"
    deadline = asyncio.get_running_loop().time() + LAUNCH_TIMEOUT
    while asyncio.get_running_loop().time() < deadline:
        if process.poll() is not None:
            raise BrowserUnavailable(f"chromium exited with {process.returncode} at start: {_tail(log)}")
        lines = marker.read_text().splitlines() if marker.exists() else []
        if lines and lines[0].isdigit():
            return int(lines[0])
        await asyncio.sleep(0.05)
    raise TimeoutError(f"chromium published no DevTools port within {LAUNCH_TIMEOUT:.0f}s: {_tail(log)}")


def _tail(log: Path) -> str:
    return " | ".join(log.read_text(errors="replace").splitlines()[-5:]) if log.exists() else "(no log)"


@dataclass
class Response:
    """The HTTP response that delivered a page's document."""

    url: str
    status: int
    mime_type: str


@dataclass
class Page:
    """One tab: navigate, query the DOM with JavaScript, move the mouse, take screenshots."""

    socket: aiohttp.ClientWebSocketResponse
    reader: asyncio.Task[None] | None = None
    errors: list[str] = field(default_factory=list)
    """Uncaught exceptions of the page's scripts and console errors, as one line each."""
    response: Response | None = None
    """The document response of the last `goto` or `reload`."""
    _next_id: int = 0
    _pending: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    _loaded: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self) -> None:
        """Route the socket's messages: replies to their callers, events to the page's state."""
        async for message in self.socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            else:
                self._event(data.get("method", ""), data.get("params", {}))
        for future in self._pending.values():
            if not future.done():
                future.set_exception(PageError("the browser closed the DevTools connection"))

    def _event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self._loaded.set()
        elif method == "Network.responseReceived" and params.get("type") == "Document":
            r = params["response"]
            self.response = Response(r["url"], int(r["status"]), r.get("mimeType", ""))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", "?"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))

    async def call(self, method: str, timeout: float = CALL_TIMEOUT, **params: Any) -> dict[str, Any]:
        """Send one DevTools command and return its result (a PageError when it failed)."""
        self._next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        await self.socket.send_str(json.dumps({"id": self._next_id, "method": method, "params": params}))
        try:
            reply = await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise TimeoutError(f"DevTools {method} got no reply within {timeout:.0f}s") from None
        finally:
            self._pending.pop(self._next_id, None)
        if "error" in reply:
            raise PageError(f"DevTools {method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    async def goto(self, url: str, timeout: float = CALL_TIMEOUT) -> Response:
        """Open `url` and wait for its load event; returns the document's HTTP response."""
        self._loaded.clear()
        self.response = None
        result = await self.call("Page.navigate", url=url)
        if result.get("errorText"):
            raise PageError(f"navigating to {url}: {result['errorText']}")
        return await self._wait_loaded(url, timeout)

    async def reload(self, timeout: float = CALL_TIMEOUT) -> Response:
        """Reload the page (bypassing the cache) and wait for its load event."""
        self._loaded.clear()
        self.response = None
        await self.call("Page.reload", ignoreCache=True)
        return await self._wait_loaded("the reload", timeout)

    async def _wait_loaded(self, what: str, timeout: float) -> Response:
        try:
            await asyncio.wait_for(self._loaded.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(f"{what} did not finish loading within {timeout:.0f}s") from None
        if self.response is None:
            raise PageError(f"{what}: no document response was seen")
        return self.response

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise PageError(f"{expression[:80]!r} threw: "
                            f"{details.get('exception', {}).get('description') or details.get('text')}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = CALL_TIMEOUT) -> Any:
        """The first truthy value of a JavaScript expression, polled until `timeout`."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{expression[:120]!r} stayed falsy for {timeout:.0f}s")
            await asyncio.sleep(0.05)

    async def text(self, selector: str = "body") -> str:
        """The visible text of the first element matching `selector` (a PageError when none does)."""
        return await self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                                   f"if (!e) throw new Error('no element matches ' + {json.dumps(selector)}); "
                                   "return e.innerText; })()")

    async def texts(self, selector: str) -> list[str]:
        """The visible text of every element matching `selector`."""
        return await self.evaluate(f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.innerText)")

    async def count(self, selector: str) -> int:
        return await self.evaluate(f"document.querySelectorAll({json.dumps(selector)}).length")

    async def center(self, selector: str) -> tuple[float, float]:
        """The viewport coordinates of the middle of the first element matching `selector`, scrolled into view."""
        box = await self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); "
                                  "if (!e) return null; e.scrollIntoView({block: 'center'}); "
                                  "const r = e.getBoundingClientRect(); "
                                  "return [r.left + r.width / 2, r.top + r.height / 2, r.width, r.height]; })()")
        if box is None:
            raise PageError(f"no element matches {selector!r}")
        if box[2] <= 0 or box[3] <= 0:
            raise PageError(f"{selector!r} is not visible (its box is {box[2]}x{box[3]})")
        return box[0], box[1]

    async def hover(self, selector: str) -> None:
        """Move the mouse onto the element, as a user would (the page sees mouseover/mousemove)."""
        x, y = await self.center(selector)
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    async def click(self, selector: str, *, navigates: bool = False, timeout: float = CALL_TIMEOUT) -> Response | None:
        """Click the element with the left button; with `navigates`, wait for the page it opens to load and
        return its document's response."""
        x, y = await self.center(selector)
        await self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        if navigates:
            self._loaded.clear()
            self.response = None
        for kind in ("mousePressed", "mouseReleased"):
            await self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
        return await self._wait_loaded(f"clicking {selector!r}", timeout) if navigates else None

    async def type(self, selector: str, text: str) -> None:
        """Focus the element and type `text` into it, key by key (the page sees input events)."""
        await self.click(selector)
        for char in text:
            await self.call("Input.dispatchKeyEvent", type="char", text=char)

    async def screenshot(self, path: Path, full_page: bool = True) -> Path:
        """A PNG of the page (the whole document when `full_page`, capped at 8000 px tall) written to `path`."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await self.call("Page.getLayoutMetrics")
            size = metrics["cssContentSize"]
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": max(size["width"], 1),
                                                             "height": min(max(size["height"], 1), 8000),
                                                             "scale": 1})
        data = await self.call("Page.captureScreenshot", timeout=30.0, **params)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return path

    async def close(self) -> None:
        """Close the tab and its connection (the browser stays up)."""
        with contextlib.suppress(Exception):
            await self.call("Page.close", timeout=2.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.socket.close(), 2.0)
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader
