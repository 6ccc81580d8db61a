"""Logging setup: plain or JSON lines on stderr, with secrets masked in every line.

Masking happens when a line is formatted, after the message and any traceback are rendered and before JSON
escaping, so a configured secret cannot reach the output through arguments, exception text or a library's
own log message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable

MASK = "***"


class Redactor:
    """Replaces every configured secret value (3 characters or longer) with ``MASK``, also as it appears
    inside a Python repr or a JSON string (escaped quotes and backslashes)."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms = {form for s in secrets if s and len(s) >= 3 for form in (s, repr(s)[1:-1], json.dumps(s)[1:-1])}
        self._secrets = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, MASK)
        return text


class PlainFormatter(logging.Formatter):
    def __init__(self, redact: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        return self.redact(super().format(record))


class JsonFormatter(logging.Formatter):
    def __init__(self, redact: Redactor | None = None) -> None:
        super().__init__()
        self.redact = redact or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": self.redact(record.getMessage()),
        }
        if record.exc_info:
            doc["exc"] = self.redact(self.formatException(record.exc_info))
        return json.dumps(doc, ensure_ascii=False)


def setup(level: str = "INFO", fmt: str = "plain", secrets: Iterable[str] = ()) -> None:
    redact = Redactor(secrets)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(redact) if fmt == "json" else PlainFormatter(redact))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # librdkafka is chatty about 0.9-compatibility settings; its warnings still get through.
    logging.getLogger("globald.librdkafka").setLevel(max(logging.WARNING, logging.getLevelName(level)))
