"""Typed global tables (issue 24): values (and keys) decoded from JSON, Avro or Protobuf into Arrow columns.

The store keeps the bytes exactly as Kafka delivered them; decoding happens on the reading side:
- ``load(fmt, where)``: the ``Decoder`` of a table's declared format
  (``globald.settings.typed_spec.ValueFormat``), every schema file read and checked; ``check-config`` calls it for
  each table.
- ``Decoder.decode(values)``: a binary column in, a typed column (and per-row errors) out (``globald.typed.arrow``).
- ``globald.typed.columnar.ensure_columnar(snapshot, decoder)``: a snapshot decoded once per host into an Arrow IPC
  file beside it, which every worker maps read-only and looks keys up in, vectorized; with a typed key decoder, by
  the decoded keys (``globald.typed.keys``). Raw tables map the same file, through the identity decoder
  (``globald.spark.mapped``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from globald.settings.typed_spec import SchemaError, ValueFormat, fingerprint

if TYPE_CHECKING:
    from globald.settings.config import Config
    from globald.typed.arrow import Decoder, OneValue
    from globald.typed.registry import Registry

__all__ = ["SchemaError", "ValueFormat", "check_schemas", "load", "load_table"]

RAW = ValueFormat()


def load(fmt: ValueFormat | None, where: str, registry: Registry | None = None,
         reader_id: int | None = None) -> Decoder:
    """The decoder of ``fmt`` (None: raw), named ``where`` ("tables[0].value") in errors. Raises SchemaError for a
    schema that cannot be read or used, ConfigError when the ``typed`` extra is missing. ``registry``: the table's
    Schema Registry, for a ``subject`` or ``writer_schemas = "registry"`` (``globald.typed.registry``);
    ``reader_id``: the subject's schema id to read with, instead of the version the daemon pinned."""
    fmt = fmt or RAW
    if fmt.uses_registry and registry is None:
        raise SchemaError(f"{where}.subject" if fmt.subject else f"{where}.writer_schemas",
                          "needs a [registry] table with its url")
    try:
        import pyarrow as pa

        from globald.typed.arrow import Decoder

        if not fmt.typed:
            return Decoder(fmt, where, pa.binary(), None, fingerprint(fmt, where))
        compile_format: Callable[[ValueFormat, str], tuple[pa.DataType, OneValue]]
        if fmt.format == "avro":
            from globald.typed.avro import compile_avro as compile_format
        elif fmt.format == "protobuf":
            from globald.typed.protobuf import compile_protobuf as compile_format
        else:
            from globald.typed.jsonfmt import compile_json as compile_format
    except ImportError as e:
        raise SchemaError(f"{where}.format", f"{fmt.format} needs the typed and spark extras (pip install "
                          f"'globald[typed,spark]'): {e}") from None
    if not fmt.uses_registry:
        arrow_type, one = compile_format(fmt, where)
        return Decoder(fmt, where, arrow_type, one, fingerprint(fmt, where))
    from globald.typed.avro import compile_avro
    from globald.typed.jsonfmt import compile_json

    assert registry is not None
    reader_text = None
    if fmt.subject is not None:
        pin, reader_text = registry.reader(where.rpartition(".")[2], fmt, where, reader_id)
        reader_id = pin.id
    if fmt.format == "json":  # a JSON value decodes without its writer schema: writer ids need no fetch
        arrow_type, one = compile_json(fmt, where, reader_text)
        return Decoder(fmt, where, arrow_type, one, fingerprint(fmt, where, reader_text), reader_id=reader_id)
    if fmt.format == "protobuf":
        from globald.typed.protobuf import compile_protobuf

        arrow_type, one = compile_protobuf(fmt, where, registry, reader_text)
    else:
        arrow_type, one = compile_avro(fmt, where, registry, reader_text)
    return Decoder(fmt, where, arrow_type, one, fingerprint(fmt, where, reader_text),
                   registry.available if fmt.writers_from_registry else None, reader_id)


def check_schemas(config: Config, *, without_subjects: bool = False) -> None:
    """Load every declared format of every table, as ``check-config`` does: the first bad one raises.
    ``without_subjects``: leave out the sections whose reader schema is a registry subject (``run`` takes those
    itself, and starts when the registry is down)."""
    for i, t in enumerate(config.tables):
        for section, fmt in (("key", t.key), ("value", t.value)):
            if fmt is not None and fmt.typed and not (without_subjects and fmt.subject is not None):
                load(fmt, f"tables[{i}].{section}", _registry(config, t.name, fmt))


def _registry(config: Config, table: str, fmt: ValueFormat | None) -> Registry | None:
    if fmt is None or not fmt.uses_registry:
        return None
    from globald.typed.registry import registry_of

    return registry_of(config, table, fmt.format)


def load_table(config: Config, table: str, reader_ids: dict[str, int] | None = None) -> tuple[Decoder, Decoder]:
    """(key decoder, value decoder) of ``table`` in a loaded config; ``reader_ids`` ("key", "value": a registry
    subject's schema id) read with those reader schemas instead of the versions the daemon pinned."""
    ids = reader_ids or {}
    for i, t in enumerate(config.tables):
        if t.name == table:
            return (load(t.key, f"tables[{i}].key", _registry(config, t.name, t.key), ids.get("key")),
                    load(t.value, f"tables[{i}].value", _registry(config, t.name, t.value), ids.get("value")))
    config.table(table)  # raises UnknownTableError naming the known ones
    raise AssertionError("unreachable")
