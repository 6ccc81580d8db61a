"""What librdkafka says, as globald logs it: known-harmless 0.9 lines at DEBUG, a repeated problem once.

Every globald client (the daemon's consumer, the snapshot builder's, the embedded broker's admin) logs through
``kafka_log``. Two filters sit on it:

- Lines that only restate a choice the config made for an old broker (the two deprecation warnings at every start,
  AUTOCREATE at every metadata request, the occasional PROTOERR on a 0.9 broker's metadata answer) go to DEBUG.
- A problem librdkafka repeats (an unreachable broker is retried every few milliseconds: 388 ERROR lines in 20 s
  were seen) is logged once; repeats are counted and summed up in one line every ``report_every`` seconds while it
  lasts, and one INFO line says when it cleared (``cleared()``, called once the daemon reaches the cluster again).
  Lines are told apart by their text without the parts that change at every retry (durations, suppression counts).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass

kafka_log = logging.getLogger("globald.librdkafka")
log = logging.getLogger(__name__)  # not kafka_log: logs.setup keeps that one at WARNING and above

_KNOWN_HARMLESS = ("allow.auto.create.topics=false not supported by broker",
                   "Configuration property api.version.request is deprecated",
                   "Configuration property broker.version.fallback is deprecated",
                   # librdkafka 2.x parsing a 0.9 broker's Metadata v0 answer; the request is retried and succeeds.
                   "Not enough room in tmpabuf")

# "(after 0ms in state CONNECT)", "(after 12ms in state UP, 3 identical error(s) suppressed)", "in 1.2s", and the
# client's instance in "[globald#consumer-3]": the daemon's consumer and the cluster worker's meet the same broker
# problem, which is one problem, logged once.
_VARYING = (re.compile(r"\s*\((after \d+ms|\d+ identical)(?:[^()]|\([^()]*\))*\)"),
            re.compile(r"\b\d+(\.\d+)?(ms|s)\b"),
            re.compile(r"(?<=#)(consumer|producer)-\d+"))


class _HarmlessAtDebug(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and any(m in record.getMessage() for m in _KNOWN_HARMLESS):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return kafka_log.isEnabledFor(logging.DEBUG)
        return True


def problem_key(message: str) -> str:
    for pattern in _VARYING:
        message = pattern.sub("", message)
    return message.strip()


@dataclass
class _Seen:
    text: str
    level: int
    first: float
    last_report: float
    since_report: int = 0
    total: int = 1


class RepeatedProblems(logging.Filter):
    """Lets the first line of each distinct problem through, counts the repeats, and reports them."""

    def __init__(self, report_every: float = 60.0, forget_after: float = 300.0, straggling: float = 2.0) -> None:
        super().__init__()
        self.report_every = report_every
        self.forget_after = forget_after  # a problem quiet this long is new again when it comes back
        # librdkafka hands its log lines over at the next poll: lines of a problem that cleared can arrive just
        # after the "cleared" line. They are dropped for this long rather than logged as the problem coming back.
        self.straggling = straggling
        self._seen: dict[str, _Seen] = {}
        self._last: dict[str, float] = {}
        self._cleared: dict[str, float] = {}
        self._lock = threading.Lock()  # librdkafka logs from its own threads

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        key = problem_key(message)
        now = time.monotonic()
        with self._lock:
            if now - self._cleared.get(key, -self.straggling) < self.straggling:
                return False
            seen = self._seen.get(key)
            if seen is None or now - self._last.get(key, now) > self.forget_after:
                self._seen[key] = _Seen(message, record.levelno, now, now)
                self._last[key] = now
                return True
            self._last[key] = now
            seen.total += 1
            seen.since_report += 1
            if now - seen.last_report < self.report_every:
                return False
            record.msg, record.args = ("still: %s (%d more time(s) in the last %.0fs)",
                                       (message, seen.since_report, now - seen.last_report))
            seen.since_report, seen.last_report = 0, now
            return True

    def cleared(self) -> None:
        """The cluster answers again: say so once for every problem that was being counted, and forget them."""
        now = time.monotonic()
        with self._lock:
            seen, self._seen, self._last = self._seen, {}, {}
            self._cleared = {key: now for key in seen}
        for s in seen.values():
            if s.level >= logging.WARNING:
                log.info("librdkafka problem cleared after %.0fs (%d time(s) in all): %s", now - s.first, s.total,
                         s.text)


repeated = RepeatedProblems()
kafka_log.addFilter(_HarmlessAtDebug())
kafka_log.addFilter(repeated)
