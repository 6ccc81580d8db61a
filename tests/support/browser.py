"""Headless Chromium driven over the DevTools protocol on a pipe, for tests of the built documentation site.

``Browser.start(profile_dir)`` runs the system ``chromium`` (Debian's package, which ``make sysdeps`` installs) with
``--remote-debugging-pipe``: commands go in on the child's fd 3 and answers come out on its fd 4, JSON messages each
ended by a NUL byte. No client library and no port: nothing else can drive it. ``open(url)`` loads a page in a new
tab and waits for its load event, and with ``record_requests`` keeps the URLs the tab asks for (``requested``);
``evaluate`` runs JavaScript in it; ``type`` presses keys in it; ``document`` returns its DOM tree with shadow
roots, closed ones included (the Material theme draws each mermaid diagram into a closed shadow root, which the
page's own JavaScript cannot see). Flags: the ones the machine notes give for a quiet, sandbox-less headless run,
and a fresh profile per browser.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1280,900")


class BrowserError(RuntimeError):
    """Chromium answered a command with an error, exited, or did not answer in time: its stderr is in the message."""


@dataclass
class Browser:
    proc: subprocess.Popen[bytes]
    to_browser: int
    from_browser: int
    next_id: int = 0
    buffer: bytes = b""
    events: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, executable: str, profile_dir: Path) -> Browser:
        cmd_r, cmd_w = os.pipe()  # commands: we write, the browser reads fd 3
        out_r, out_w = os.pipe()  # answers: the browser writes fd 4, we read

        def fds() -> None:  # in the child, before exec: the numbers Chromium expects, inheritable
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (cmd_r, out_w)]  # either may be 3 or 4 itself
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        proc = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={profile_dir}", "--remote-debugging-pipe",
                                 "about:blank"], preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        os.close(cmd_r)
        os.close(out_w)
        return cls(proc, cmd_w, out_r)

    def close(self) -> None:
        for fd in (self.to_browser, self.from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)  # the browser and its renderer, GPU and utility processes
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()

    def _messages(self, timeout: float) -> Iterator[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self.buffer:
                message, self.buffer = self.buffer.split(b"\0", 1)
                yield json.loads(message)
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"no answer from chromium within {timeout:.0f}s")
            ready, _, _ = select.select([self.from_browser], [], [], left)
            if ready:
                chunk = os.read(self.from_browser, 1 << 20)
                if not chunk:
                    err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    raise BrowserError(f"chromium exited ({self.proc.wait()}): {err[-2000:]}")
                self.buffer += chunk

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60.0) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        for answer in self._messages(timeout):
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return dict(answer.get("result", {}))
            if "method" in answer:
                self.events.append(answer)
        raise AssertionError("unreachable")

    def wait_event(self, method: str, session: str, timeout: float = 60.0) -> dict[str, Any]:
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        for message in self._messages(timeout):
            if message.get("method") == method and message.get("sessionId") == session:
                return message
            if "method" in message:
                self.events.append(message)
        raise AssertionError("unreachable")

    def open(self, url: str, timeout: float = 60.0, record_requests: bool = False) -> str:
        """A new tab on ``url``, loaded (its load event fired); returns the session to talk to it.

        With ``record_requests``, every request the tab makes from then on (its same-process iframes' too) is kept
        for ``requested``: whether it reached anything, it was asked for.
        """
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=session)
        if record_requests:
            self.send("Network.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        self.wait_event("Page.loadEventFired", session, timeout)
        return str(session)

    def close_tab(self, session: str) -> None:
        self.send("Page.close", session=session)

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, session=session)
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def requested(self, session: str) -> list[str]:
        """The URLs the tab asked for since ``open(..., record_requests=True)`` or the last call, in order."""
        self.evaluate(session, "0")  # its answer comes after the events of what the tab did before it
        urls: list[str] = []
        kept: list[dict[str, Any]] = []
        for e in self.events:
            if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == session:
                urls.append(str(e["params"]["request"]["url"]))
            else:
                kept.append(e)
        self.events = kept
        return urls

    def type(self, session: str, text: str) -> None:
        """Presses the keys of ``text`` in the focused element, each down and up as a person's keyboard does (the
        theme's search box answers keyup, not a changed value)."""
        for key in text:
            self.send("Input.dispatchKeyEvent", {"type": "keyDown", "key": key, "text": key}, session=session)
            self.send("Input.dispatchKeyEvent", {"type": "keyUp", "key": key}, session=session)

    def document(self, session: str) -> dict[str, Any]:
        """The page's DOM, shadow roots included (closed ones too)."""
        return dict(self.send("DOM.getDocument", {"depth": -1, "pierce": True}, session=session)["root"])


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of a ``Browser.document`` tree, shadow roots' and frames' contents included."""
    yield node
    for key in ("children", "shadowRoots"):
        for child in node.get(key, []):
            yield from nodes(child)
    if "contentDocument" in node:
        yield from nodes(node["contentDocument"])
