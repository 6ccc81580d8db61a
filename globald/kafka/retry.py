"""The retry policy for transient faults: exponential backoff with jitter, each wait bounded, never giving up.

The daemon loop must keep serving the tables that are healthy, so instead of blocking in a retry loop it asks
``Backoff`` when the next attempt for a given thing is due. The delays come from tenacity's own wait strategy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tenacity import RetryCallState, Retrying, wait_exponential_jitter


@dataclass
class Backoff:
    initial_s: float = 0.2
    max_s: float = 10.0
    jitter_s: float = 0.5
    _failures: dict[str, int] = field(default_factory=dict)
    _due: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._wait = wait_exponential_jitter(multiplier=self.initial_s, max=self.max_s, jitter=self.jitter_s)
        # The wait strategy reads only the attempt number off a call state; this one never runs anything.
        self._retrying = Retrying()

    def failed(self, what: str) -> float:
        """Record a failure of ``what``; returns the delay before its next attempt."""
        n = self._failures.get(what, 0) + 1
        self._failures[what] = n
        state = RetryCallState(self._retrying, None, (), {})
        state.attempt_number = n
        delay = min(self.max_s, self._wait(state))
        self._due[what] = time.monotonic() + delay
        return delay

    def succeeded(self, what: str) -> None:
        self._failures.pop(what, None)
        self._due.pop(what, None)

    def due(self, what: str) -> bool:
        return time.monotonic() >= self._due.get(what, 0.0)

    def failures(self, what: str) -> int:
        return self._failures.get(what, 0)
