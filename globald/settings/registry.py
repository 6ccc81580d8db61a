"""The [registry] table: the Schema Registry's URL and the settings of confluent-kafka's ``SchemaRegistryClient``.

Guarantees, as for [kafka] (``globald.settings.kafka_properties``): a value is printed (the config echo, ``check-config
--json``, status) only when its key is on ``PRINTABLE`` (identities, file paths, timeouts); any other one
(``basic.auth.user.info``, ``bearer.auth.token``, ``bearer.auth.client.secret``, ``ssl.key.password``, a key nobody
listed) is shown as ``***`` and its value is among ``secret_values``, which the log masker hides. A URL is shown
without the password it may carry. A secret need not sit in the file: ``"env:NAME"`` takes the value of the
environment variable NAME, ``"file:/path"`` the content of that file (its trailing newline dropped), both read when
the config is loaded. Which keys the client accepts is the client's business: ``check-config`` builds one, and
an unknown key is refused there, naming it. Nothing here imports the client.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from globald.common.errors import ConfigError
from globald.common.logs import MASK
from globald.settings.spec import Spec, client_property

ENV_PREFIX, FILE_PREFIX = "env:", "file:"
PRINTABLE = frozenset({
    "url", "timeout", "max.retries", "retries.wait.ms", "retries.max.wait.ms", "cache.capacity",
    "cache.latest.ttl.sec", "basic.auth.credentials.source", "bearer.auth.credentials.source",
    "bearer.auth.logical.cluster", "bearer.auth.identity.pool.id", "bearer.auth.client.id", "bearer.auth.scope",
    "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
})


def printable(name: str) -> bool:
    return name in PRINTABLE


def _url_without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:{MASK}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def redact(props: dict[str, Any] | None) -> dict[str, Any] | None:
    """A copy of the [registry] settings safe to print."""
    if props is None:
        return None
    return {k: (_url_without_password(str(v)) if k == "url" else v if printable(k) else MASK)
            for k, v in props.items()}


def secret_values(props: dict[str, Any] | None) -> list[str]:
    """What a log line must never show: the values of keys not ``printable``, the URL's password, and both halves
    of ``basic.auth.user.info`` (a client error may quote either)."""
    if not props:
        return []
    values = [str(v) for k, v in props.items() if not printable(k)]
    values += str(props.get("basic.auth.user.info", "")).split(":", 1)
    password = urlsplit(str(props.get("url", ""))).password
    return [v for v in values if v] + ([password] if password else [])


def resolve_secret(value: Any, path: str) -> Any:
    """``env:NAME`` and ``file:PATH`` replaced by what they name; ConfigError names ``path`` when it is missing."""
    if not isinstance(value, str):
        return value
    if value.startswith(ENV_PREFIX):
        name = value[len(ENV_PREFIX):]
        if name not in os.environ:
            raise ConfigError(path, f"names the environment variable {name}, which is not set")
        return os.environ[name]
    if value.startswith(FILE_PREFIX):
        where = Path(value[len(FILE_PREFIX):])
        try:
            return where.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(path, f"cannot read {where}: {getattr(e, 'strerror', None) or e}") from None
    return value


@dataclass(frozen=True)
class RegistryProperties(Spec):
    """[registry]: ``url`` and the client's own settings (strings, numbers, booleans), secrets resolved."""

    def check(self, value: object, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ConfigError(path, "must be a table")
        out: dict[str, Any] = {}
        for key, v in value.items():
            client_property(path, key, v, "registry client settings")
            out[key] = resolve_secret(v, f"{path}.{key}")
        url = out.get("url")
        if not isinstance(url, str) or not all(u.strip().startswith(("http://", "https://"))
                                               for u in url.split(",")):
            raise ConfigError(f"{path}.url", "is required: an http:// or https:// URL (or several, comma-separated)")
        return out

    def kind(self) -> str:
        return "section: url, then SchemaRegistryClient settings (strings, numbers, booleans)"
