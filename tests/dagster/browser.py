"""A headless Chromium driven over the Chrome DevTools Protocol (``websockets``): open a page, wait for
text, click an element by its text, read the page's text and images, take a screenshot. Started in its
own process group with a fresh profile and stopped by that group."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websockets
from .procs import free_port

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1600,1000"]


def chromium_path() -> str | None:
    return os.environ.get("AUTORESEARCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, ws: Any) -> None:
        self.ws, self._id = ws, 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        mine = self._id
        await self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        while True:
            msg = json.loads(await self.ws.recv())
            if msg.get("id") == mine:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        r = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return r.get("result", {}).get("value")

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def text(self) -> str:
        return await self.evaluate("document.body ? document.body.innerText : ''") or ""

    async def wait_for_text(self, *needles: str, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = await self.text()
            if all(n in text for n in needles):
                return text
            await asyncio.sleep(0.5)
        raise AssertionError(f"page never showed {needles}; it showed:\n{text[:2000]}")

    async def click_text(self, label: str) -> bool:
        """Click the innermost element whose text is exactly ``label``; False when there is none."""
        return bool(await self.evaluate(
            "(() => { const e = [...document.querySelectorAll('a,button,span,div')]"
            f".filter(x => x.children.length == 0 && x.innerText && x.innerText.trim() == {json.dumps(label)});"
            " if (!e.length) return false; e[0].click(); return true; })()"))

    async def images(self) -> list[dict[str, Any]]:
        return await self.evaluate(
            "[...document.images].map(i => ({src: i.src.slice(0, 40), width: i.naturalWidth,"
            " height: i.naturalHeight, complete: i.complete}))") or []

    async def screenshot(self, path: Path) -> Path:
        shot = await self.call("Page.captureScreenshot", format="png")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


class Browser:
    """``async with Browser() as page:`` a fresh headless Chromium's first tab."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or chromium_path()
        if not self.binary:
            raise RuntimeError("no chromium: run scripts/browser.sh")

    async def __aenter__(self) -> Page:
        port, self.profile = free_port(), tempfile.mkdtemp(prefix="chromium-")
        self.proc = subprocess.Popen([self.binary, *FLAGS, f"--user-data-dir={self.profile}",
                                      f"--remote-debugging-port={port}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, "TMPDIR": self.profile})  # its temp dirs go with the profile
        deadline, tabs = time.monotonic() + 30, None
        while tabs is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=1) as r:
                    tabs = [t for t in json.load(r) if t.get("type") == "page"] or None
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self._stop()
                    raise RuntimeError("chromium did not open its DevTools port")
                time.sleep(0.2)
        self.ws = await websockets.connect(tabs[0]["webSocketDebuggerUrl"], max_size=64 * 2 ** 20)
        page = Page(self.ws)
        await page.call("Page.enable")
        return page

    def _stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()
        self._stop()
