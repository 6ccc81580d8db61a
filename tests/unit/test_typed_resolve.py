"""check-config and run resolve an Avro reader schema against every writer schema (issue 33, item 4): one that
cannot read a writer is exit 2 with one line naming the key, the writer file and the field; nothing is touched.
What the check accepts, fastavro reads; what it refuses, fastavro fails on (at least for some value)."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import fastavro
import pytest

from globald.typed.avro_resolve import Incompatible, resolve
from tests.harness import globald
from tests.unit.test_typed_config import write
from tests.unit.typed_fixtures import FIXTURES, customer_v2

V2 = json.loads((FIXTURES / "customer_v2.avsc").read_text())
READER = json.loads((FIXTURES / "customer_reader.avsc").read_text())


def field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in schema["fields"] if f["name"] == name)


def changed(schema: dict[str, Any], which: str, **kw: Any) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    field(out, which).update(kw)
    return out


def without_default(schema: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    field(out, name).pop("default")
    return out


def city_as_int(schema: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(schema)
    field(field(out, "address")["type"][1], "city")["type"] = "int"
    return out


INCOMPATIBLE = [  # (reader, the field named, words of the reason)
    (changed(READER, "name", type="int"), "field name:", "string cannot be read as int"),
    (without_default(READER, "segment"), "field segment:", "no such field"),
    (changed(READER, "tier", type={"type": "enum", "name": "Tier", "symbols": ["BRONZE", "SILVER"]}), "field tier:",
     "['GOLD']"),
    (changed(READER, "phone", type="string", default=""), "field phone:", "null cannot be read as string"),
    (city_as_int(READER), "field address.city:", "string cannot be read as int"),
    (changed(READER, "tags", type={"type": "array", "items": "long"}), "field tags[]:", "string cannot be read"),
    ({**READER, "name": "Client"}, "the record:", "is not the reader's Client"),
]
COMPATIBLE = [
    changed(READER, "visits", type="double", default=0.0),  # long promoted to double
    changed(READER, "tier", type={"type": "enum", "name": "Tier", "symbols": ["BRONZE"], "default": "BRONZE"}),
    changed(READER, "scores", type={"type": "map", "values": "long"}),
    {**READER, "name": "Client", "aliases": ["shop.Customer"]},
    changed(READER, "phone", name="mobile", aliases=["phone"]),
    changed(READER, "name", type=["null", "string"]),
]


def fastavro_reads(writer: dict[str, Any], reader: dict[str, Any], record: dict[str, Any]) -> bool:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(writer), record)
    buf.seek(0)
    try:
        fastavro.schemaless_reader(buf, fastavro.parse_schema(writer), fastavro.parse_schema(reader))
    except fastavro.read.SchemaResolutionError:
        return False
    return True


RECORDS = [customer_v2(i) for i in range(6)] + [{**customer_v2(1), "phone": None, "tier": "GOLD"}]


@pytest.mark.parametrize(("reader", "where", "why"), INCOMPATIBLE)
def test_an_incompatible_reader_is_refused_naming_the_field(reader: Any, where: str, why: str) -> None:
    with pytest.raises(Incompatible) as e:
        resolve(V2, reader)
    assert str(e.value).startswith(where) and why in str(e.value), str(e.value)
    assert not all(fastavro_reads(V2, reader, r) for r in RECORDS)


@pytest.mark.parametrize("reader", COMPATIBLE)
def test_a_compatible_reader_is_accepted_and_fastavro_reads_with_it(reader: Any) -> None:
    resolve(V2, reader)
    assert all(fastavro_reads(V2, reader, r) for r in RECORDS)


@pytest.mark.parametrize("command", ["check-config", "run"])
def test_check_config_and_run_refuse_a_reader_that_cannot_read_a_writer(tmp_path: Path, command: str) -> None:
    config = write(tmp_path, '[tables.value]\nformat = "avro"\nschema = "schemas/bad_reader.avsc"\n'
                             'framing = "confluent"\nwriter_schemas = "schemas/ids"\n')
    (tmp_path / "schemas" / "bad_reader.avsc").write_text(json.dumps(city_as_int(READER)))
    r = globald(command, "--config", str(config))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("globald: config error: tables[0].value.writer_schemas: the reader schema ")
    assert "cannot read writer schema" in lines[0] and "ids/1.avsc: field address.city: " in lines[0], lines[0]
    assert not (tmp_path / "state").exists()
