"""sd_notify over the ``NOTIFY_SOCKET`` datagram socket, without libsystemd: READY, STATUS, WATCHDOG, STOPPING.

Without ``NOTIFY_SOCKET`` every call is a no-op. A send that fails is logged once and never raised: systemd
going away must not take the daemon with it. The watchdog is pinged at half of ``WATCHDOG_USEC``, as
sd_watchdog_enabled(3) advises, and only when ``WATCHDOG_PID`` (if set) names this process.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

from globald.common import swallowed

log = logging.getLogger(__name__)

ENV_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _address(raw: str) -> str | None:
    if raw.startswith("@"):
        return "\0" + raw[1:]  # a Linux abstract socket
    if raw.startswith("/"):
        return raw
    return None  # vsock and other address families are not supported


class Notifier:
    def __init__(self, address: str | None = None, watchdog_seconds: float | None = None) -> None:
        self.address = address
        self.watchdog_interval = watchdog_seconds / 2 if watchdog_seconds else None
        self._sock: socket.socket | None = None
        self._last_ping = 0.0
        self.ready_sent = False
        self.failures = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        address = _address(env.get("NOTIFY_SOCKET", ""))
        if env.get("NOTIFY_SOCKET") and address is None:
            log.warning("NOTIFY_SOCKET=%r is not a unix socket path; sd_notify disabled", env["NOTIFY_SOCKET"])
        watchdog: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            watchdog = int(usec) / 1_000_000
        return cls(address, watchdog)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=value`` lines in one datagram. Newlines inside a value would start a new assignment."""
        if self.address is None:
            return False
        payload = "\n".join(a.replace("\n", " ") for a in assignments).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(payload, self.address)
            return True
        except OSError as e:  # counted here and in globald_swallowed_failures_total; logged at a bounded rate
            self.failures += 1
            swallowed.record("sd_notify", e, log, "sd_notify to %s failed", self.address.replace("\0", "@"))
            return False

    def ready(self, status: str) -> None:
        """READY=1, once: later calls only update STATUS (systemd has no way back to 'not ready')."""
        if self.ready_sent:
            self.status(status)
            return
        self.ready_sent = self.send("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> None:
        """Ping the watchdog if half its interval has passed; call it from every loop iteration."""
        if self.watchdog_interval is None or self.address is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_interval:
            self._last_ping = now
            self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
