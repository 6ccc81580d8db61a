"""Logging setup: plain or JSON lines on stderr, with secrets masked in every message."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


class SecretFilter(logging.Filter):
    """Masks the configured secret values wherever they would appear in a log line."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._secrets = sorted({s for s in secrets if s and len(s) >= 3}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            msg = record.getMessage()
            masked = msg
            for s in self._secrets:
                masked = masked.replace(s, "***")
            if masked != msg:
                record.msg, record.args = masked, None
        return True


def setup(level: str = "INFO", fmt: str = "plain", secrets: Iterable[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(SecretFilter(secrets))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # librdkafka is chatty about 0.9-compatibility settings; its warnings still get through.
    logging.getLogger("globald.librdkafka").setLevel(max(logging.WARNING, logging.getLevelName(level)))
