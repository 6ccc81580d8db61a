"""Several record types in one topic (Confluent's TopicRecordNameStrategy): a reader schema that is an Avro union
of record types.

Spark has no union type: its ``from_avro`` gives a union of several types as a struct of one field per branch,
named ``member0``, ``member1``... globald gives the same shape with clearer names: one field per record type, named
by the record's name (its full name with "." as "_" where two types share a short name), exactly one of them set
per value. A ``"null"`` branch makes the value nullable, as elsewhere. So a topic of customers and orders reads as
``value: struct<Customer: struct<id, ...>, Order: struct<total, ...>>``: ``value.Order.total`` in Spark SQL,
``value.Order IS NOT NULL`` to keep the orders, and ``flatten=True`` gives the columns ``value_Customer`` and
``value_Order``. Each writer (one record schema per id) is resolved to the union branch of the same full name, as
Avro's resolution rules say; a record of a type the union does not list is a decode error naming it.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from globald.typed.arrow import DecodeError


def full_name(schema: Any, namespace: str = "") -> str | None:
    """The full name of a named Avro schema (as JSON); None for another."""
    if not isinstance(schema, dict) or not isinstance(schema.get("name"), str):
        return None
    name: str = schema["name"]
    return name if "." in name else f"{schema.get('namespace', namespace)}.{name}".lstrip(".")


class RecordBranches:
    """The record types of a reader union, each the column it becomes."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records
        fulls = [full_name(r) or "" for r in records]
        shorts = [f.rpartition(".")[2] for f in fulls]
        unique = len(set(shorts)) == len(shorts)
        self.columns = {f: (s if unique else f.replace(".", "_")) for f, s in zip(fulls, shorts, strict=True)}

    @classmethod
    def of(cls, raw: Any) -> RecordBranches | None:
        """The branches of a reader schema that is a union of two or more record types; None for any other."""
        if not isinstance(raw, list):
            return None
        real = [b for b in raw if b != "null"]
        if len(real) < 2 or not all(isinstance(b, dict) and b.get("type") == "record" for b in real):
            return None
        return cls(real)

    def arrow_type(self, of: Any) -> pa.DataType:
        """The struct of one field per record type; ``of`` maps one Avro schema to its Arrow type."""
        return pa.struct([pa.field(self.columns[full_name(r) or ""], of(r)) for r in self.records])

    def pick(self, record: Any, writer_name: str | None) -> dict[str, Any] | None:
        """A decoded value as that struct: fastavro gives (name, record) when the writer is the union itself, the
        record alone when the writer is one record type (its name is then the writer's); None for the null branch."""
        if record is None:
            return None
        name, value = record if isinstance(record, tuple) else (writer_name, record)
        column = self.columns.get(name or "")
        if column is None:
            raise DecodeError(f"record type {name} is not one of the reader schema's {sorted(self.columns)}")
        return {c: (value if c == column else None) for c in self.columns.values()}
