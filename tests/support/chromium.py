"""Headless Chromium (Debian's ``chromium`` package) driven over the Chrome DevTools protocol with
``websocket-client``: start the browser with a fresh profile and no network use, open a page, evaluate script in
it, collect console errors and uncaught exceptions, take a screenshot."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import websocket

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-port=0",  # the browser picks a free port and writes it to DevToolsActivePort
)


def find_chromium() -> str | None:
    """The browser's path, or None where it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Chromium:
    """One headless browser with one page; use as a context manager. ``events`` keeps every protocol event
    received so far (console messages, exceptions, log entries)."""

    def __init__(self, binary: str, profile: Path, timeout: float = 60.0):
        self.timeout = timeout
        profile.mkdir(parents=True, exist_ok=True)
        self.log = (profile.parent / "chromium.log").open("w")
        self.proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.events: list[dict] = []
        self._next_id = 0
        try:
            port = self._devtools_port(profile / "DevToolsActivePort")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=timeout) as r:
                targets = json.load(r)
            page = next(t for t in targets if t["type"] == "page")
            self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout, suppress_origin=True)
        except BaseException:
            self.close()
            raise

    def _devtools_port(self, port_file: Path) -> int:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}; see {self.log.name}")
            text = port_file.read_text() if port_file.is_file() else ""
            if text.strip():
                return int(text.split()[0])
            time.sleep(0.1)
        raise TimeoutError(f"chromium wrote no DevTools port in {self.timeout:.0f} s; see {self.log.name}")

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def call(self, method: str, **params) -> dict:
        """Send one protocol command and return its result (events arriving meanwhile go to ``events``)."""
        self._next_id += 1
        self.ws.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method: str) -> dict:
        """The first event named ``method`` (already received or the next to come)."""
        deadline = time.monotonic() + self.timeout
        seen = 0
        while time.monotonic() < deadline:
            for msg in self.events[seen:]:
                if msg["method"] == method:
                    return msg
            seen = len(self.events)
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(f"no {method} event in {self.timeout:.0f} s")

    def open(self, path: Path, width: int = 1280, height: int = 900) -> None:
        """Load a local file in a ``width`` x ``height`` window and wait for its load event."""
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=Path(path).resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        """The JSON value of a script expression (a promise is awaited); a thrown error raises here."""
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def errors(self) -> list[str]:
        """Console errors, failed assertions, uncaught exceptions and error-level log entries so far."""
        out = []
        for msg in self.events:
            p = msg.get("params", {})
            if msg["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif msg["method"] == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails"))[:500])
            elif msg["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + p["entry"].get("text", ""))
        return out

    def screenshot(self, out: Path, max_height: int = 4000) -> Path:
        """A PNG of the page from its top, the window's width and at most ``max_height`` pixels of its length."""
        size = self.call("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height), "scale": 1}
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
        out = Path(out)
        out.write_bytes(base64.b64decode(shot["data"]))
        return out
