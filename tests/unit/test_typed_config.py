"""[tables.value] and [tables.key]: declared once, validated with one line naming the key, paths taken from the
config file's directory, and check-config loading every schema (exit 2 naming the file, nothing touched)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from globald.common.errors import ConfigError
from globald.settings.config import Config, load, parse
from globald.settings.spec import declared_keys
from tests.harness import globald
from tests.unit.typed_fixtures import FIXTURES

BASE = """
state_dir = "state"
[kafka]
"bootstrap.servers" = "127.0.0.1:9092"
[[tables]]
name = "customers"
topic = "customers"
"""


def write(tmp_path: Path, section: str) -> Path:
    shutil.copytree(FIXTURES, tmp_path / "schemas")
    path = tmp_path / "g.toml"
    path.write_text(BASE + section)
    return path


def test_sections_are_declared_keys_with_the_contracts_names() -> None:
    paths = {k.path for k in declared_keys(Config)}
    for section in ("value", "key"):
        assert {f"tables[].{section}.{name}" for name in
                ("format", "schema", "message", "framing", "writer_schemas", "on_error")} <= paths


def test_relative_schema_paths_are_taken_from_the_config_files_directory(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, '[tables.value]\nformat = "avro"\nschema = "schemas/customer_reader.avsc"\n'
                               'framing = "confluent"\nwriter_schemas = "schemas/ids"\n'
                               '[tables.key]\nformat = "json"\nschema = "schemas/customer.ddl"\n'))
    table = cfg.tables[0]
    assert table.value is not None and table.key is not None
    assert table.value.schema == tmp_path / "schemas" / "customer_reader.avsc"
    assert table.value.writer_schemas == tmp_path / "schemas" / "ids"
    assert table.key.schema == tmp_path / "schemas" / "customer.ddl"
    assert (table.value.on_error, table.key.framing) == ("null", "none")


def test_without_the_section_the_value_stays_raw(tmp_path: Path) -> None:
    table = load(write(tmp_path, "")).tables[0]
    assert table.value is None and table.key is None


RULES = [
    ('[tables.value]\nformat = "avro"\n', "tables[0].value.schema", "is required"),
    ('[tables.value]\nformat = "protobuf"\nschema = "x.desc"\n', "tables[0].value.message", "is required"),
    ('[tables.value]\nformat = "json"\nschema = "x"\nmessage = "a.B"\n', "tables[0].value.message", "protobuf\" only"),
    ('[tables.value]\nformat = "json"\nschema = "x"\nwriter_schemas = "ids"\n', "tables[0].value.writer_schemas",
     "confluent"),
    ('[tables.value]\nformat = "avro"\nschema = "x"\nframing = "confluent"\n', "tables[0].value.writer_schemas",
     "is required"),
    ('[tables.value]\nschema = "x"\n', "tables[0].value.schema", "raw"),
    ('[tables.value]\nformat = "xml"\n', "tables[0].value.format", "must be one of"),
    ('[tables.key]\non_error = "ignore"\n', "tables[0].key.on_error", "must be one of"),
    ('[tables.value]\nsurprise = 1\n', "tables[0].value.surprise", "unknown key"),
]


@pytest.mark.parametrize(("section", "key", "why"), RULES)
def test_rules_name_the_key(section: str, key: str, why: str) -> None:
    import tomllib

    with pytest.raises(ConfigError) as e:
        parse(tomllib.loads(BASE + section))
    assert e.value.key == key and why in str(e.value)


@pytest.mark.parametrize(("section", "key", "file"), [
    ('[tables.value]\nformat = "avro"\nschema = "schemas/nope.avsc"\n', "tables[0].value.schema", "nope.avsc"),
    ('[tables.value]\nformat = "avro"\nschema = "schemas/customer.ddl"\n', "tables[0].value.schema",
     "customer.ddl is not a valid Avro schema"),
    ('[tables.key]\nformat = "protobuf"\nschema = "schemas/shop.proto"\nmessage = "shop.Customer"\n',
     "tables[0].key.schema", "shop.proto is not a usable protobuf descriptor set"),
    ('[tables.value]\nformat = "avro"\nschema = "schemas/customer_reader.avsc"\nframing = "confluent"\n'
     'writer_schemas = "schemas/none"\n', "tables[0].value.writer_schemas", "cannot list"),
])
def test_check_config_loads_every_schema(tmp_path: Path, section: str, key: str, file: str) -> None:
    r = globald("check-config", "--config", str(write(tmp_path, section)))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"globald: config error: {key}: ") and file in lines[0]
    assert not (tmp_path / "state").exists()


def test_check_config_accepts_good_schemas(tmp_path: Path) -> None:
    r = globald("check-config", "--config", str(write(
        tmp_path, '[tables.value]\nformat = "avro"\nschema = "schemas/customer_reader.avsc"\nframing = "confluent"\n'
                  'writer_schemas = "schemas/ids"\n[tables.key]\nformat = "json"\nschema = "schemas/customer.ddl"\n')))
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


def test_dump_decode_lines_decode_keys_too_and_keep_reasons() -> None:
    import json

    from globald import typed
    from globald.cli.read import decoded_lines
    from globald.settings.typed_spec import ValueFormat
    from globald.typed.arrow import DecodeFailure

    keys = typed.load(ValueFormat(format="json", schema=FIXTURES / "customer.ddl"), "tables[0].key")
    values = typed.load(ValueFormat(format="json", schema=FIXTURES / "customer.ddl"), "tables[0].value")
    items = [(b'{"id": 1}', b'{"id": 5, "balance": 1.5, "since": "2020-02-03"}', 7), (b'{"id": 2}', b"{", -1)]
    docs = [json.loads(line) for line in decoded_lines(items, keys, values)]
    assert docs[0]["key"]["id"] == 1 and docs[0]["timestamp"] == 7 and "error" not in docs[0]
    assert docs[0]["value"]["balance"] == "1.50" and docs[0]["value"]["since"] == "2020-02-03"
    assert docs[1]["value"] is None and docs[1]["error"].startswith("invalid JSON")
    strict = typed.load(ValueFormat(format="json", schema=FIXTURES / "customer.ddl", on_error="fail"), "t")
    with pytest.raises(DecodeFailure, match=r"""value of key '{"id": 2}' \(partition unknown"""):
        list(decoded_lines(items, typed.load(None, "k"), strict))
