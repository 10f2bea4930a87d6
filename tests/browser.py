"""Headless Chromium driven over the DevTools protocol on a pipe (no extra packages):
open a page, evaluate JavaScript in it, take a screenshot."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--remote-debugging-pipe",
    "--window-size=1200,900",
)


class Browser:
    """One Chromium process; the protocol's messages are JSON separated by NUL bytes on
    fds 3 (to Chromium) and 4 (from it)."""

    def __init__(self, profile: Path) -> None:
        if not os.path.exists(CHROMIUM):
            raise FileNotFoundError(f"{CHROMIUM} is missing (Debian package chromium)")
        to_child, self._write = os.pipe()
        self._read, from_child = os.pipe()
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            pass_fds=(3, 4),  # kept open after _map_fds put the pipes there
            preexec_fn=lambda: _map_fds(to_child, from_child),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for fd in (to_child, from_child):
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        self.session = ""

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        self.call("Page.enable", session=True)
        self.call("Page.navigate", session=True, url=url)

    def evaluate(self, expression: str) -> Any:
        reply = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        return reply["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.2)
        raise TimeoutError(f"{expression!r} stayed false for {timeout_s} s")

    def images(self) -> list[tuple[str, int]]:
        """``(src, natural width)`` of every image once the page and all of them loaded
        (a width of 0: one that failed)."""
        return self.wait_for(
            "document.readyState === 'complete' && [...document.images].every(i => i.complete)"
            " && [...document.images].map(i => [i.getAttribute('src'), i.naturalWidth])"
        )

    def screenshot(self, path: Path) -> None:
        metrics = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        data = self.call(
            "Page.captureScreenshot",
            session=True,
            format="png",
            captureBeyondViewport=True,
            clip={
                "x": 0,
                "y": 0,
                "width": metrics["width"],
                "height": metrics["height"],
                "scale": 1,
            },
        )["data"]
        path.write_bytes(base64.b64decode(data))

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def _message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._read, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self._buffer += chunk
        text, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(text)

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, OSError):  # it may be gone already
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._write)
        os.close(self._read)


def _map_fds(to_child: int, from_child: int) -> None:
    """In the child, before it closes what it does not keep: the pipe ends become fds 3
    and 4, as Chromium's ``--remote-debugging-pipe`` wants. Both are first copied above
    both targets, so neither is overwritten before it is copied; nothing is done in the
    parent, where another thread could be using any fixed descriptor number."""
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]
    os.dup2(high[0], 3)
    os.dup2(high[1], 4)
