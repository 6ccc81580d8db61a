"""The tests' Schema Registry: the local one ``globald dev --registry`` serves (``globald/embedded/registry.py``),
under the name the tests have always used, plus the ways a registry fails that are not "connection refused"
(``stop()``), switchable while it serves (``fault(...)``, ``heal()``), as the chaos campaign injects them:

- ``SILENT``: accepts the connection, reads the request, never answers (until healed; the answer then goes to a
  client that gave up long ago);
- ``UNAVAILABLE`` (503) and ``THROTTLED`` (429), each with ``Retry-After: <retry_after>`` seconds, the way a
  registry behind a load balancer or Confluent Cloud's rate limit answers;
- ``UNAUTHORIZED``: 401 with error_code 40101, as a registry whose credentials were rotated answers;
- ``SLOW``: every answer right, but only after ``delay_s`` (set it above the client's ``timeout``).

``faulted`` counts the requests met by a fault, by mode: a test shows its fault landed by it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from globald.embedded.registry import LocalRegistry, _Error
from globald.typed.registry_http import forget_clients

SILENT, UNAVAILABLE, THROTTLED, UNAUTHORIZED, SLOW = "silent", "503", "429", "401", "slow"
MODES = (SILENT, UNAVAILABLE, THROTTLED, UNAUTHORIZED, SLOW)


class RegistryDouble(LocalRegistry):
    def __init__(self, users: dict[str, str] | None = None, tokens: set[str] | None = None,
                 tls: tuple[str, str] | None = None, tls_ca: str | None = None) -> None:
        super().__init__(users, tokens, tls, tls_ca)
        self.mode: str | None = None
        self.retry_after = 30
        self.delay_s = 0.0
        self.faulted: Counter[str] = Counter()
        self._healed = threading.Event()
        self._healed.set()

    def start(self) -> RegistryDouble:
        # A port the OS gave an earlier test's registry may be this one's: the clients this process keeps per URL
        # (and the schemas they cached by id, which differ between registries) must not outlive that one.
        forget_clients()
        super().start()
        return self

    def fault(self, mode: str, retry_after: int = 30, delay_s: float = 0.0) -> None:
        """From now on every request meets ``mode`` (one of ``MODES``) until ``heal()``."""
        if mode not in MODES:
            raise ValueError(f"unknown registry fault {mode!r}: one of {MODES}")
        self.retry_after, self.delay_s = retry_after, delay_s
        self._healed.clear()
        self.mode = mode

    def heal(self) -> None:
        self.mode = None
        self._healed.set()  # a silent or slow request held now answers (its client may be gone)

    def stop(self) -> None:
        self._healed.set()  # no handler thread left waiting on a fault
        super().stop()

    def intercept(self) -> _Error | None:
        mode = self.mode
        if mode is None:
            return None
        self.faulted[mode] += 1
        if mode == SILENT:
            self._healed.wait()
            return None
        if mode == SLOW:
            deadline = time.monotonic() + self.delay_s
            while not self._healed.is_set() and time.monotonic() < deadline:
                self._healed.wait(deadline - time.monotonic())
            return None
        if mode == UNAUTHORIZED:
            return _Error(401, 40101, "Unauthorized")
        status = 503 if mode == UNAVAILABLE else 429
        message = "Service Unavailable" if status == 503 else "Too Many Requests"
        return _Error(status, status, message, {"Retry-After": str(self.retry_after)})


__all__ = ["MODES", "SILENT", "SLOW", "THROTTLED", "UNAUTHORIZED", "UNAVAILABLE", "RegistryDouble"]
