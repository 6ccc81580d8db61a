"""Logging setup: plain or JSON lines on stderr, with secrets masked in every line.

Masking happens when a line is formatted, after the message and any traceback are rendered and before JSON
escaping, so a configured secret cannot reach the output through arguments, exception text or a library's
own log message.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from collections.abc import Iterable, Iterator

MASK = "***"

# Values too short or too common to look for: masking "true", "3000" or "ssl" would garble every line that holds
# them, and no such value is a credential worth hiding.
MIN_MASKED_LENGTH = 4
_NOT_A_SECRET = re.compile(r"(?i)true|false|[+-]?\d+(\.\d*)?")


def _maskable(text: str) -> bool:
    return len(text) >= MIN_MASKED_LENGTH and not _NOT_A_SECRET.fullmatch(text)


def _parts(secret: str) -> Iterator[str]:
    """The secret, and each of its tails that starts after whitespace: librdkafka quotes a value it cannot parse
    from the point it stopped ("Unrecognized sasl.oauthbearer.config beginning at: ..."), not whole."""
    yield secret.strip()
    for m in re.finditer(r"\s+", secret):
        yield secret[m.end():].strip()


class Redactor:
    """Replaces every configured secret value with ``MASK``, also its tails after whitespace and each as it
    appears inside a Python repr or a JSON string (escaped quotes and backslashes). Values shorter than
    ``MIN_MASKED_LENGTH`` characters, booleans and numbers are left alone."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        forms = {form for s in secrets for part in _parts(s) if _maskable(part)
                 for form in (part, repr(part)[1:-1], json.dumps(part)[1:-1])}
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


def reconfigure(level: str, secrets: Iterable[str] = ()) -> None:
    """A reload (``service.reload``): the new level, and ``secrets`` masked too from now on by each handler ``setup``
    made (the secrets already masked stay masked: a line may still quote an old one)."""
    root = logging.getLogger()
    root.setLevel(level)
    logging.getLogger("globald.librdkafka").setLevel(max(logging.WARNING, logging.getLevelName(level)))
    for handler in root.handlers:
        formatter = handler.formatter
        if isinstance(formatter, PlainFormatter | JsonFormatter):
            added = Redactor(secrets)._secrets
            formatter.redact._secrets = sorted({*formatter.redact._secrets, *added}, key=len, reverse=True)
