"""What a table declares about its values (``[tables.value]``) and keys (``[tables.key]``), and loading it.

``ValueFormat`` is both the config section (each field a key declared through ``globald.settings.spec``) and the
frozen options every decoder is built from, so the config, ``check-config --keys`` and the decoders cannot drift.
Loading a format (``load``) reads every schema file it names; a file that is missing or does not parse is a
``SchemaError`` naming the key and the file, which the CLI prints as one line (exit 2). Nothing here imports a
decoding library: ``globald.settings.config`` imports this module, and the ``typed`` extra is needed only to decode.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from globald.common.errors import ConfigError
from globald.settings.spec import Choice, Directory, Integer, Text, declare

FORMATS = ("raw", "json", "avro", "protobuf")
FRAMINGS = ("none", "confluent")
ON_ERROR = ("null", "fail")
# What a writer_schemas directory holds per format: <id><suffix>, the id being the Confluent schema id.
WRITER_SUFFIX = {"avro": ".avsc", "json": ".json", "protobuf": ".desc"}
# Bumped whenever decoding changes what a decoded column holds, so columnar files of an older decoder are rebuilt.
DECODER_VERSION = "2"  # 2: Avro checked against its writer schema (globald.typed.avro_check) and max_items
# What one value may decode to by default: array items and map entries (JSON: array elements and object members;
# protobuf: repeated elements and map entries), all levels together. At 1M, the worst value (an Avro array of
# nulls or of empty records, whose items take no bytes) costs a reader about 60 MB while it decodes (measured).
DEFAULT_MAX_ITEMS = 1_000_000
# writer_schemas = "registry": each writer id is fetched from [registry] when first met (globald.typed.registry).
REGISTRY = Path("registry")


class SchemaError(ConfigError):
    """A schema file named by a table's [tables.value] or [tables.key] section is missing, unreadable or invalid.
    Fix the file (or the path) the message names; nothing was touched."""


@dataclass(frozen=True)
class ValueFormat:
    format: str = field(default="raw", metadata=declare(Choice(
        FORMATS, help="raw: bytes as stored; json, avro, protobuf: decoded into typed columns by the schema")))
    schema: Path | None = field(default=None, metadata=declare(Directory(
        help="avro: the reader schema (.avsc; a union of record types: one struct field per type); json: a file "
             "holding a Spark DDL string or a JSON Schema; protobuf: a descriptor set (protoc --include_imports "
             "--descriptor_set_out); relative paths are taken "
             "from the config file's directory")))
    message: str | None = field(default=None, metadata=declare(Text(
        help="protobuf: the full name of the message type in the descriptor set (shop.Customer)")))
    framing: str = field(default="none", metadata=declare(Choice(
        FRAMINGS, help="confluent: each value starts with magic byte 0, a 4-byte big-endian schema id and, for "
                       "protobuf, the message-index array")))
    writer_schemas: Path | None = field(default=None, metadata=declare(Directory(
        help="confluent framing: a directory of <id>.avsc / <id>.json / <id>.desc, one per schema id a record may "
             "carry, an id not there being a decode error; or \"registry\": each id is fetched from [registry] when "
             "first met and kept in state_dir (required for avro with confluent framing; a directory named "
             "registry is written as an absolute path)")))
    subject: str | None = field(default=None, metadata=declare(Text(
        help="the reader schema is this Schema Registry subject's (customers-value), not a schema file: its latest "
             "version as the daemon took it at start (or at a reload), or subject_version; protobuf: message names "
             "the reader's message type in it (or in a file it imports)")))
    subject_version: int | None = field(default=None, metadata=declare(Integer(
        1, 2**31 - 1, help="with subject: this version of it, pinned, instead of the latest")))
    on_error: str = field(default="null", metadata=declare(Choice(
        ON_ERROR, help="null: a value that does not decode becomes null, counted, with the reason; fail: the read "
                       "fails naming the key and the reason")))
    max_items: int = field(default=DEFAULT_MAX_ITEMS, metadata=declare(Integer(
        1, 1 << 31, help="the most array items and map entries (json: array elements and object members) one "
                         "value may decode to, all levels together; a value claiming more is a decode error for "
                         "that value alone (an Avro array of nulls costs no bytes per item: without this bound one "
                         "record could claim billions)")))

    @property
    def typed(self) -> bool:
        return self.format != "raw"

    @property
    def writers_from_registry(self) -> bool:
        return self.writer_schemas == REGISTRY

    @property
    def uses_registry(self) -> bool:
        return self.writers_from_registry or self.subject is not None

    def resolved(self, base: Path) -> ValueFormat:
        """The same format with relative paths taken from ``base`` (the config file's directory)."""
        def absolute(p: Path | None) -> Path | None:
            return p if p is None or p.is_absolute() or p == REGISTRY else base / p

        return replace(self, schema=absolute(self.schema), writer_schemas=absolute(self.writer_schemas))


def check_format_keys(fmt: ValueFormat, path: str) -> None:
    """The rules between keys of one section (the ``after`` rule of its configspec Section)."""
    if fmt.format == "raw":
        for name in ("schema", "message", "writer_schemas", "subject", "subject_version"):
            if getattr(fmt, name) is not None:
                raise ConfigError(f"{path}.{name}", 'has no meaning with format = "raw"')
        if fmt.framing != "none":
            raise ConfigError(f"{path}.framing", 'must be "none" with format = "raw" (raw values are not decoded)')
        return
    if fmt.subject_version is not None and fmt.subject is None:
        raise ConfigError(f"{path}.subject_version", "needs subject (the version of which subject)")
    if fmt.subject is not None and fmt.schema is not None:
        raise ConfigError(f"{path}.subject", "and schema both name the reader schema: keep one")
    if fmt.schema is None and fmt.subject is None:
        raise ConfigError(f"{path}.schema", f"is required with format = {fmt.format!r} (or subject, from the "
                          "Schema Registry)")
    if (fmt.format == "protobuf") != (fmt.message is not None):
        raise ConfigError(f"{path}.message", "is required with format = \"protobuf\"" if fmt.format == "protobuf"
                          else "is for format = \"protobuf\" only")
    if fmt.writer_schemas is not None and fmt.framing != "confluent":
        raise ConfigError(f"{path}.writer_schemas", 'needs framing = "confluent" (ids come from the record header)')
    if fmt.format == "avro" and fmt.framing == "confluent" and fmt.writer_schemas is None:
        raise ConfigError(f"{path}.writer_schemas", "is required for avro with confluent framing: a record is "
                          "decoded with the writer schema its id names, then resolved to the reader schema")


def read_schema_file(path: Path, where: str) -> bytes:
    """A schema file's bytes, or SchemaError naming the key ``where`` and the file."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise SchemaError(where, f"cannot read {path}: {e.strerror or e}") from None


def writer_files(fmt: ValueFormat, where: str) -> dict[int, Path]:
    """The schema id -> file of the writer_schemas directory (empty without one, or from the registry)."""
    if fmt.writer_schemas is None or fmt.writers_from_registry:
        return {}
    suffix = WRITER_SUFFIX[fmt.format]
    try:
        entries = sorted(os.scandir(fmt.writer_schemas), key=lambda e: e.name)
    except OSError as e:
        raise SchemaError(f"{where}.writer_schemas", f"cannot list {fmt.writer_schemas}: {e.strerror or e}") from None
    found: dict[int, Path] = {}
    for entry in entries:
        stem, dot, ext = entry.name.partition(".")
        if f"{dot}{ext}" != suffix:
            continue
        if not stem.isdigit() or int(stem) >= 1 << 31:
            raise SchemaError(f"{where}.writer_schemas", f"{entry.path}: the name must be a schema id (<id>{suffix})")
        found[int(stem)] = Path(entry.path)
    return found


def fingerprint(fmt: ValueFormat, where: str, reader_text: str | None = None) -> str:
    """A digest of the format, every schema file's content and the decoder version: a columnar file decoded under
    one fingerprint is valid for exactly that declaration. From a registry: the reader schema's text taken from the
    subject (``reader_text``); writer ids are not part of it (an id never changes meaning: a file decoded before an
    id was fetched is redone by its pending ids, ``globald.typed.registry``)."""
    h = hashlib.sha256(repr((DECODER_VERSION, fmt.format, fmt.message, fmt.framing, fmt.on_error,
                             fmt.max_items)).encode())
    if fmt.writers_from_registry:
        h.update(b"writers from the registry\0")
    if reader_text is not None:
        h.update(b"subject\0" + reader_text.encode())
    if fmt.schema is not None:
        h.update(read_schema_file(fmt.schema, f"{where}.schema"))
    for sid, path in sorted(writer_files(fmt, where).items()):
        h.update(b"%d\0" % sid)
        h.update(read_schema_file(path, f"{where}.writer_schemas"))
    return h.hexdigest()

