"""Schemas from a Schema Registry ([registry]): writer schemas fetched by id when first met, reader schemas taken
from a subject, all kept durably in ``state_dir/registry``.

Why confluent-kafka's own ``SchemaRegistryClient``: it is the client of the registry's makers, already a dependency
(the Kafka client), and it configures basic auth, bearer tokens and TLS the way every Confluent client does
(``basic.auth.user.info``, ``bearer.auth.*``, ``ssl.*``: the [registry] table is handed to it as it is).

Contract:
- Writer schemas (``writer_schemas = "registry"``): an id is looked for in memory, then in the cache directory
  ``state_dir/registry/schemas/<id>.avsc`` (the writer_schemas directory format, so the cache is also a directory a
  table can name), then asked of the registry and written there durably (``store.durable.replace_file``) before it
  is used. A registry id never changes meaning, so a cached schema is never fetched again and a restart with the
  registry down decodes every id seen before. Avro references are inlined at their first use, so each cached file
  stands alone.
- An id the registry cannot give yet (unreachable, 5xx, unauthorized) is a *pending* decode: ``PendingSchema``, a
  decode error whose text is "schema N not yet fetched (why)", never a bad record. It is asked again at most every
  ``RETRY_S`` per process. Two failures hold every id of every process on the host (the daemon starts a decode
  process per attempt, so a per-process memory alone would ask again at each): a 429 or 503 with ``Retry-After``
  (no id is asked before that time, bounded by ``registry_http.MAX_WAIT_S``), and a request that timed out (a
  silent or slow registry: ``RETRY_S``, so that it costs one timeout, not one per id). That wait is kept in
  ``state_dir/registry/wait.json`` (``registry_http.HostWait``) and ends early when the registry answers. The
  columnar file of a snapshot records its pending ids, and is decoded again once one of them can be had
  (``globald.typed.columnar``, ``globald.ops.decoding``). An id the registry says it does not have (40403) is an
  ordinary decode error.
- Reader schemas (``subject``): ``take_reader_schemas`` (the daemon at start, and the reload) asks the registry for
  each subject's latest version (or ``subject_version``) and pins it in ``state_dir/registry/readers/`` (subject,
  version, id), the schema itself cached by id. Readers (Spark, the decode process, ``get --decode``) read the pin,
  so they decode with the schema the daemon took, never a newer one registered meanwhile. Without a pin (no daemon
  has run) the registry is asked directly.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from globald.common.errors import ConfigError, GlobaldError
from globald.settings.registry import redact
from globald.settings.typed_spec import SchemaError, ValueFormat
from globald.store.durable import make_dirs, replace_file
from globald.store.names import REGISTRY_DIR
from globald.typed.references import MAX_REF_DEPTH, dereference, inline, proto_descriptor_set, proto_file
from globald.typed.registry_http import (
    HostWait,
    client,
    describe,
    forget_retry_after,
    is_not_found,
)

if TYPE_CHECKING:
    from globald.settings.config import Config

log = logging.getLogger(__name__)

SCHEMAS_DIR, READERS_DIR = "schemas", "readers"
RETRY_S = 5.0  # an id the registry could not give is asked again at most this often per process
WAIT_FILE = "wait.json"
SCHEMA_TYPES = {"avro": "AVRO", "json": "JSON", "protobuf": "PROTOBUF"}  # globald format -> the registry's schemaType
SUFFIXES = {"AVRO": ".avsc", "JSON": ".json", "PROTOBUF": ".desc"}  # as in a writer_schemas directory


class RegistryUnavailable(GlobaldError):
    """The Schema Registry could not be reached or refused the request (unreachable, unauthorized, a subject not
    found). Check [registry] url and credentials, and that the subject exists; the message says which failed."""


@dataclass(frozen=True)
class Pin:
    """The reader schema in force for a subject: the version the daemon took and its registry id."""

    subject: str
    version: int
    id: int


def cache_dir(state_dir: Path) -> Path:
    return state_dir / REGISTRY_DIR


class Registry:
    """One table's view of the registry: its client settings and the daemon's cache directory."""

    def __init__(self, settings: dict[str, Any], state_dir: Path, table: str, fmt: str = "avro") -> None:
        self.settings = settings
        self.dir = cache_dir(state_dir)
        self.table = table
        self.kind = SCHEMA_TYPES[fmt]  # the registry's schemaType of the table's format
        self._schemas: dict[int, str] = {}
        self._failed: dict[int, float] = {}  # id -> monotonic time of the last failed fetch
        self.wait = HostWait(self.dir / WAIT_FILE, table, self._store)

    @property
    def where(self) -> str:
        return str((redact(self.settings) or {}).get("url"))

    # -- writer schemas by id ------------------------------------------------------------------------------

    def writer(self, schema_id: int) -> str:
        """The self-contained text of schema ``schema_id``: PendingSchema while the registry cannot give it,
        DecodeError when it says there is none."""
        from globald.typed.arrow import DecodeError, PendingSchema

        text = self._schemas.get(schema_id) or self._cached(schema_id)
        if text is not None:
            return text
        failed = self._failed.get(schema_id)
        if failed is not None and time.monotonic() - failed < RETRY_S:
            raise PendingSchema(schema_id, f"registry {self.where} did not answer; asked again within {RETRY_S:.0f}s")
        waiting = self.wait.waiting()
        if waiting is not None:
            raise PendingSchema(schema_id, f"registry {self.where}: {waiting}")
        forget_retry_after()
        try:
            text = self._fetch(schema_id)
        except DecodeError:  # the registry answered, with a schema this cannot use: no use waiting for it
            self._failed[schema_id] = time.monotonic()
            raise
        except Exception as e:
            self._failed[schema_id] = time.monotonic()
            if is_not_found(e):
                raise DecodeError(f"schema {schema_id} is not in the registry {self.where}: {describe(e)}") from None
            raise PendingSchema(schema_id, f"registry {self.where}: {self.wait.hold_all(e, RETRY_S)}") from None
        self._failed.pop(schema_id, None)
        return text

    def available(self, ids: list[int]) -> bool:
        """Whether any of ``ids`` (pending when a columnar file was decoded) can be had now."""
        from globald.typed.arrow import DecodeError

        for sid in ids:
            try:
                self.writer(int(sid))
                return True
            except DecodeError:
                continue
        return False

    def _path(self, schema_id: int) -> Path:
        return self.dir / SCHEMAS_DIR / f"{schema_id}{SUFFIXES[self.kind]}"

    def _cached(self, schema_id: int) -> str | None:
        try:
            if self.kind == "PROTOBUF":  # a binary descriptor set on disk, its base64 in memory
                text = base64.standard_b64encode(self._path(schema_id).read_bytes()).decode("ascii")
            else:
                text = self._path(schema_id).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        self._schemas[schema_id] = text
        return text

    def _fetch(self, schema_id: int) -> str:
        from globald.typed.arrow import DecodeError

        schema = client(self.settings).get_schema(schema_id, fmt=self._format)
        self.wait.answered()
        if (schema.schema_type or "AVRO") != self.kind:
            raise DecodeError(f"schema {schema_id} is {schema.schema_type or 'AVRO'}, not {self.kind}")
        if self.kind == "PROTOBUF":
            text = base64.standard_b64encode(self._proto_set(schema, f"schema-{schema_id}.proto")).decode("ascii")
        elif self.kind == "JSON":
            text = json.dumps(self._json_expanded(schema)) if schema.references else schema.schema_str
        else:
            text = json.dumps(self._expanded(schema))
        self._schemas[schema_id] = text
        try:
            self._store(self._path(schema_id), text)
        except OSError as e:  # decoded all the same; only a restart with the registry down would miss it
            log.warning("table %s: writer schema %d fetched from the registry %s, but not cached in %s: %s",
                        self.table, schema_id, self.where, self.dir, e)
            return text
        log.info("table %s: writer schema %d fetched from the registry %s and cached", self.table, schema_id,
                 self.where)
        return text

    def _expanded(self, schema: Any) -> Any:
        """The schema as JSON with every reference's named types inlined at their first use."""
        named: dict[str, Any] = {}
        for ref in schema.references or []:
            registered = client(self.settings).get_version(ref.subject, ref.version)
            named[ref.name] = self._expanded(registered.schema)
        return inline(json.loads(schema.schema_str), named)

    @property
    def _format(self) -> str | None:
        """The registry's output format asked for: a Protobuf schema as its serialized FileDescriptorProto (the
        form Confluent's own deserializer asks for), so that no .proto parser is needed here."""
        return "serialized" if self.kind == "PROTOBUF" else None

    def _proto_set(self, schema: Any, name: str) -> bytes:
        """A serialized FileDescriptorSet of the schema and every file it imports, imports first (the form of a
        writer_schemas .desc file): references fetched from their subject versions, well-known types
        (google/protobuf/*) from the runtime; a set the runtime cannot build is a DecodeError."""
        from globald.typed.arrow import DecodeError

        texts: dict[str, str | None] = {}
        self._proto_texts(schema, name, texts)  # the registry's errors pass: an outage is a pending decode
        try:
            return proto_descriptor_set({n: proto_file(n, text) for n, text in texts.items()})
        except (ValueError, KeyError, TypeError) as e:
            raise DecodeError(f"Protobuf schema not usable: {e}") from None

    def _proto_texts(self, schema: Any, name: str, texts: dict[str, str | None], depth: int = 0) -> None:
        from globald.typed.arrow import DecodeError

        if depth > MAX_REF_DEPTH:  # protobuf forbids import cycles; a registry that has one is not waited for
            raise DecodeError(f"Protobuf references nested over {MAX_REF_DEPTH} deep at {name} (a cycle?)")
        for ref in schema.references or []:
            if ref.name not in texts:
                got = client(self.settings).get_version(ref.subject, ref.version, fmt="serialized")
                self._proto_texts(got.schema, ref.name, texts, depth + 1)
        texts[name] = schema.schema_str

    def _json_expanded(self, schema: Any) -> Any:
        """A JSON Schema with every ``$ref`` to a reference's name (``address.json``, ``address.json#/x``) and every
        local one replaced by what it names, so that it stands alone."""
        from globald.typed.arrow import DecodeError

        docs: dict[str, Any] = {}
        for ref in schema.references or []:
            registered = client(self.settings).get_version(ref.subject, ref.version)
            docs[ref.name] = self._json_expanded(registered.schema)
        root = json.loads(schema.schema_str)
        try:
            return dereference(root, root, docs, 0)
        except (KeyError, IndexError, ValueError) as e:
            raise DecodeError(f"JSON Schema reference not resolved: {e}") from None

    def _store(self, path: Path, text: str) -> None:
        make_dirs(path.parent)
        replace_file(path, base64.standard_b64decode(text) if path.suffix == SUFFIXES["PROTOBUF"] else text)

    # -- reader schemas by subject -------------------------------------------------------------------------

    def _pin_path(self, section: str) -> Path:
        return self.dir / READERS_DIR / f"{self.table}.{section}.json"

    def pinned(self, section: str, fmt: ValueFormat) -> Pin | None:
        """The pin the daemon took for this section, if it matches ``fmt``'s subject (and version)."""
        try:
            doc = json.loads(self._pin_path(section).read_text(encoding="utf-8"))
            pin = Pin(str(doc["subject"]), int(doc["version"]), int(doc["id"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if pin.subject != fmt.subject or fmt.subject_version not in (None, pin.version):
            return None
        return pin

    def resolve(self, fmt: ValueFormat) -> Pin:
        """Ask the registry for the subject's latest (or pinned) version; RegistryUnavailable says why not."""
        from globald.typed.arrow import DecodeError

        assert fmt.subject is not None
        try:
            c = client(self.settings)
            # get_version("latest") asks the registry each time; get_latest_version would answer from a cache.
            got = c.get_version(fmt.subject, fmt.subject_version or "latest", fmt=self._format)
            self.wait.answered()
            pin = Pin(fmt.subject, int(got.version), int(got.schema_id))
            self.writer(pin.id)  # the schema itself, cached by id like any other
        except (DecodeError, GlobaldError) as e:
            raise RegistryUnavailable(f"registry {self.where}, subject {fmt.subject}: {e}") from None
        except Exception as e:
            raise RegistryUnavailable(f"registry {self.where}, subject {fmt.subject}: {describe(e)}") from None
        return pin

    def take(self, section: str, fmt: ValueFormat) -> tuple[Pin, str]:
        """Resolve the subject now and pin it (the daemon's start, and a reload): (pin, what changed)."""
        before = self.pinned(section, fmt)
        pin = self.resolve(fmt)
        if pin != before:
            self._store(self._pin_path(section), json.dumps(pin.__dict__))
        if before is None:
            return pin, f"took {pin.subject} version {pin.version} (schema {pin.id})"
        if before == pin:
            return pin, f"kept {pin.subject} version {pin.version} (schema {pin.id}), the latest"
        return pin, f"moved {pin.subject} from version {before.version} to {pin.version} (schema {pin.id})"

    def reader(self, section: str, fmt: ValueFormat, where: str, schema_id: int | None = None) -> tuple[Pin, str]:
        """(pin, schema text) of the reader schema in force: the daemon's pin, else the registry's answer now.
        ``schema_id``: that one instead (a job's descriptor names the one its version was refreshed with)."""
        from globald.typed.arrow import DecodeError

        pin = self.pinned(section, fmt) if schema_id is None else Pin(fmt.subject or "", 0, schema_id)
        try:
            if pin is None:
                pin = self.resolve(fmt)
            return pin, self.writer(pin.id)
        except (RegistryUnavailable, DecodeError) as e:
            raise SchemaError(f"{where}.subject", f"the reader schema cannot be had: {e}") from None


def registry_of(config: Config, table: str, fmt: str = "avro") -> Registry | None:
    return None if config.registry is None else Registry(config.registry, config.state_dir, table, fmt)


def _subject_sections(config: Config) -> Iterator[tuple[str, str, ValueFormat, Registry]]:
    """(table, section, its format, its registry view) of every section whose reader schema is a subject."""
    for t in config.tables:
        for section, fmt in (("value", t.value), ("key", t.key)):
            if fmt is None or fmt.subject is None:
                continue
            reg = registry_of(config, t.name, fmt.format)
            assert reg is not None  # parse() refuses a subject without [registry]
            yield t.name, section, fmt, reg


def reader_pins(config: Config) -> dict[tuple[str, str], Pin | None]:
    """The pin in force of every (table, section) whose reader schema is a subject: what a reload compares before
    and after it took them again, to decode a table whose pin moved as a redeclared one."""
    return {(table, section): reg.pinned(section, fmt) for table, section, fmt, reg in _subject_sections(config)}


def take_reader_schemas(config: Config, reachable: bool = True) -> list[tuple[bool, str]]:
    """Pin every table's reader subject as the registry has it now: what ``run`` does at start and what a reload
    calls. A registry that does not answer leaves the pin already taken in force (said in the line returned); a
    subject never pinned then has no reader schema, and its readers report that. ``reachable=False`` (``probe``
    found it down) asks nothing, so a start is not held a timeout per subject. Returns (taken, what happened)
    per subject."""
    lines = []
    for table, section, fmt, reg in _subject_sections(config):
        try:
            if not reachable:
                raise RegistryUnavailable(f"registry {reg.where} is down")
            _, what = reg.take(section, fmt)
            lines.append((True, f"table {table} {section}: {what}"))
        except RegistryUnavailable as e:
            kept = reg.pinned(section, fmt)
            lines.append((False, f"table {table} {section}: {e}; " + (
                f"keeping version {kept.version} (schema {kept.id}) taken before" if kept is not None else
                "no reader schema taken yet: its values are not decoded until the registry answers")))
    return lines


def probe(config: Config) -> str | None:
    """At ``run``'s start: None when the registry answers, else one line on what failed and what is decoded
    meanwhile (the schemas cached in state_dir)."""
    if config.registry is None:
        return None
    try:
        client(config.registry).get_subjects()
        return None
    except Exception as e:
        cached = len([p for p in (cache_dir(config.state_dir) / SCHEMAS_DIR).glob("*") if p.suffix in
                      SUFFIXES.values()])
        return (f"registry {(redact(config.registry) or {}).get('url')} {describe(e)}: decoding with the {cached} "
                "schema(s) cached in state_dir; values of other writer ids wait (pending) until it answers")


def check_registry(config: Config, outage_ok: bool = False) -> str | None:
    """What ``check-config`` asks of [registry]: the client accepts its settings, the registry answers (GET
    /subjects), and every subject a table names exists. A ConfigError says in one line what failed.
    ``outage_ok`` (a reload's check): a registry that does not answer, or answers with an error (unreachable, a
    timeout, 5xx, 429, 401), is not the file's fault, and ``run`` starts through it: returned as one line, not
    raised; its subjects are then not checked (their reader schemas stay as taken before, as at a start)."""
    if config.registry is None:
        return None
    c = client(config.registry)
    where = (redact(config.registry) or {}).get("url")
    try:
        subjects = set(c.get_subjects())
    except Exception as e:
        if outage_ok:
            return f"registry.url: {where}: {describe(e)}; its subjects not checked"
        raise ConfigError("registry.url", f"{where}: {describe(e)}") from None
    for i, t in enumerate(config.tables):
        for section, fmt in (("value", t.value), ("key", t.key)):
            if fmt is not None and fmt.subject is not None and fmt.subject not in subjects:
                raise ConfigError(f"tables[{i}].{section}.subject", f"subject not found: {fmt.subject!r} is not "
                                  f"in the registry {where}")
    return None
