"""One headless Chromium for many pages, driven over the DevTools protocol on a pipe.

A page opened with ``chromium --dump-dom`` costs a browser start (~1.5 s here) and says nothing
of the page's state but its DOM; :class:`Browser` starts Chromium once (``--remote-debugging-pipe``:
no port, no network), opens each page in a tab, waits for its load event and the charts' drawing,
and returns what the page logged (console errors and warnings, uncaught exceptions, failed
loads) and what a JavaScript expression evaluated to there. Several browsers may run side by side
(one per core): each is its own process tree.

Chromium comes from Debian's ``chromium`` package (.ci/run installs it).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """A headless Chromium with one tab, spoken to over fds 3 and 4 (``--remote-debugging-pipe``)."""

    def __init__(self, exe: str, width: int = 1300, height: int = 900) -> None:
        self.profile = tempfile.mkdtemp(prefix="gpuprof-chromium-")
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds() -> None:  # the child's fd 3 reads our commands, fd 4 writes its replies
            a, b = os.dup(to_chrome_r), os.dup(from_chrome_w)
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             f"--user-data-dir={self.profile}", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--disable-quic", f"--window-size={width},{height}",
             "about:blank"],
            preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict[str, Any]] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Page", "Log"):
            self.call(f"{domain}.enable", session=self.session)

    def _send(self, method: str, params: dict[str, Any] | None, session: str | None) -> int:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        return self._id

    def _recv(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            ready, _, _ = select.select([self._r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium exited")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 120.0) -> dict[str, Any]:
        i = self._send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            m = self._recv(deadline)
            if m.get("id") == i:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                result: dict[str, Any] = m.get("result", {})
                return result
            self.events.append(m)

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=self.session)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    def open(self, url: str, timeout: float = 120.0) -> list[str]:
        """Open ``url`` and wait for its load event (the report's scripts run before it) and two
        animation frames (plotly draws in them); return what it logged as errors or warnings."""
        deadline = time.monotonic() + timeout
        for target in ("about:blank", url):  # by way of a blank page: a new #fragment alone loads nothing
            self.events = []
            self.call("Page.navigate", {"url": target}, session=self.session)
            while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
                self.events.append(self._recv(deadline))
        self.call("Runtime.evaluate", {"expression": "new Promise(r => requestAnimationFrame(() => "
                                       "requestAnimationFrame(() => r(1))))", "awaitPromise": True},
                  session=self.session, timeout=timeout)
        return problems(self.events)

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def problems(events: list[dict[str, Any]]) -> list[str]:
    """The errors and warnings among a page's DevTools events, one line each."""
    out = []
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(f"uncaught: {d.get('text')} {(d.get('exception') or {}).get('description', '')}"[:500])
        elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning", "assert"):
            out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description", "")))
                                                         for a in p.get("args", []))[:500])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append(f"log: {p['entry'].get('text')}"[:500])
    return out


def page_url(path: Path, fragment: str = "") -> str:
    return path.resolve().as_uri() + (f"#{fragment}" if fragment else "")
