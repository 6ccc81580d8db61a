"""Invalid config: one line naming the key, exit 2, nothing created."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import MISSING
from pathlib import Path
from typing import Any

import pytest

from globald.cli import main as cli
from globald.common.errors import ConfigError, UnknownTableError
from globald.settings.config import Config, Properties, Tables, load, parse
from globald.settings.kafka_properties import redact
from globald.settings.spec import Key, Section, declared_keys
from tests.harness import globald

GOOD = """
state_dir = "{state}"
[kafka]
"bootstrap.servers" = "127.0.0.1:9092"
[[tables]]
name = "customers"
topic = "customers"
"""

BAD = [
    ("state_dir = 5\n" + GOOD.split("\n", 2)[2], "state_dir"),
    (GOOD + "commit_interval_ms = -1\n", "commit_interval_ms"),
    (GOOD.replace('name = "customers"', 'name = "../escape"'), "tables[0].name"),
    (GOOD.replace('name = "customers"', 'name = "a/b"'), "tables[0].name"),
    (GOOD.replace('name = "customers"', 'name = ".."'), "tables[0].name"),
    (GOOD.replace('topic = "customers"', 'topic = "bad topic"'), "tables[0].topic"),
    (GOOD + '[[tables]]\nname = "customers"\ntopic = "other"\n', "tables[1].name"),
    (GOOD.replace('"bootstrap.servers" = "127.0.0.1:9092"', '"auto.offset.reset" = "earliest"'),
     "kafka.auto.offset.reset"),
    (GOOD.replace('"bootstrap.servers" = "127.0.0.1:9092"', '"x" = 1'), "kafka.bootstrap.servers"),
    (GOOD.replace("[[tables]]", "bogus = 1\n[[tables]]"), "kafka.bogus"),
    (GOOD + "surprise = true\n", "surprise"),
    (GOOD + 'log_level = "LOUD"\n', "log_level"),
    (GOOD + "[http]\nport = 70000\n", "http.port"),
    (GOOD + "[snapshots]\nretain = 0\n", "snapshots.retain"),
    (GOOD.replace('topic = "customers"', 'topic = "customers"\nhistory = "7 days"'), "tables[0].history"),
    (GOOD + "[snapshots]\nbuild_timeout_ms = 5\n", "snapshots.build_timeout_ms"),
    ("state_dir = [", "--config"),
    (GOOD.split("[[tables]]")[0], "tables"),
]


@pytest.mark.parametrize(("text", "key"), BAD)
def test_invalid_config_names_key_exits_2_and_touches_nothing(tmp_path: Path, text: str, key: str) -> None:
    state = tmp_path / "state"
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text.replace("{state}", str(state)))
    for command in (["check-config"], ["run"]):
        r = globald(*command, "--config", str(cfg))
        assert r.returncode == 2, (command, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and key in lines[0], r.stderr
    assert not state.exists()


def test_unknown_librdkafka_property_is_rejected_by_check_config(tmp_path: Path) -> None:
    cfg = tmp_path / "g.toml"
    cfg.write_text(GOOD.replace("{state}", str(tmp_path / "s")).replace(
        '"bootstrap.servers" = "127.0.0.1:9092"', '"bootstrap.servers" = "x:1"\n"no.such.property" = "1"'))
    r = globald("check-config", "--config", str(cfg))
    assert r.returncode == 2 and "kafka.no.such.property" in r.stderr


def test_valid_config_and_relative_state_dir(tmp_path: Path) -> None:
    cfg = tmp_path / "g.toml"
    cfg.write_text(GOOD.replace("{state}", "rel/state"))
    c = load(cfg)
    assert c.state_dir == tmp_path / "rel" / "state"
    assert c.consumer_settings()["auto.offset.reset"] == "error"
    r = globald("check-config", "--config", str(cfg))
    assert r.returncode == 0 and "OK" in r.stdout
    assert not (tmp_path / "rel").exists()


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(tmp_path / "nope.toml")
    assert e.value.key == "--config"


def test_redaction_masks_passwords_and_secrets() -> None:
    props = {"sasl.password": "hunter2", "ssl.key.password": "k", "ssl.keystore.password": "s",
             "my.client.secret": "x", "bootstrap.servers": "b:1"}
    assert redact(props) == {**dict.fromkeys(list(props)[:4], "***"), "bootstrap.servers": "b:1"}


# Each key is declared once (globald/settings/config.py); these hold the declarations to their own word and to the docs.

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "globald.toml"
LEAVES = [k for k in declared_keys(Config) if not isinstance(k.spec, Section | Tables | Properties)]


@pytest.mark.parametrize("key", [k for k in LEAVES if not k.required and k.default is not None],
                         ids=lambda k: k.path)
def test_every_default_is_within_its_own_bounds(key: Key) -> None:
    assert key.spec.check(key.default, key.path) == key.default


def _in_example(doc: dict[str, Any], path: str) -> object:
    node: object = doc
    for part in path.replace("[]", "").split("."):
        if isinstance(node, list):
            node = node[0]  # an array of tables: its first entry stands for all
        node = node.get(part, MISSING) if isinstance(node, dict) else MISSING
    return node


def test_the_example_config_documents_every_key_with_its_default() -> None:
    # The docs point here for an example of every key ("config/globald.toml ... a complete example, each key shown with
    # its default": docs/reference/configuration.md, whose tables are generated from the same declarations).
    text = EXAMPLE.read_text()
    doc = tomllib.loads(text)
    assert load(EXAMPLE).tables  # the example itself is valid
    for key in declared_keys(Config):
        value = _in_example(doc, key.path)
        if value is MISSING:  # an optional key without a useful default is shown commented out
            name = key.path.rsplit(".", 1)[-1]
            shown = rf"^#\s*({re.escape(name)}\s*=|\[{re.escape(name)}\]$)"  # a key, or a whole section ([registry])
            assert re.search(shown, text, re.MULTILINE), f"{key.path} is not in {EXAMPLE}"
        elif key in LEAVES and not key.required:
            assert key.spec.check(value, key.path) == key.default, f"{EXAMPLE} shows {key.path} = {value!r}"


def test_check_config_keys_lists_every_key_without_a_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["check-config", "--keys"]) == 0
    listed = capsys.readouterr().out
    assert all(f"{k.path}: {k.spec.kind()}" in listed for k in declared_keys(Config))
    assert cli.main(["check-config", "--keys", "--json"]) == 0
    assert [k["key"] for k in json.loads(capsys.readouterr().out)] == [k.path for k in declared_keys(Config)]
    assert cli.main(["check-config"]) == 2
    assert capsys.readouterr().err.startswith("globald: config error: --config: ")


def _good() -> dict[str, Any]:
    return {"state_dir": "/nonexistent/globald", "kafka": {"bootstrap.servers": "127.0.0.1:9092"},
            "tables": [{"name": "customers", "topic": "customers"}]}


SECTIONS = [k.path for k in declared_keys(Config) if isinstance(k.spec, Section) and "[]" not in k.path]


@pytest.mark.parametrize("where", ["", *SECTIONS, "tables"])
def test_an_unknown_key_is_named_in_every_section(where: str) -> None:
    raw = _good()
    section = raw if not where else raw["tables"][0] if where == "tables" else raw.setdefault(where, {})
    section["surprise"] = 1
    with pytest.raises(ConfigError) as e:
        parse(raw)
    assert e.value.key == ("surprise" if not where else "tables[0].surprise" if where == "tables"
                           else f"{where}.surprise")
    assert "unknown key" in str(e.value)


def test_unknown_table_names_it_and_the_configured_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = parse(_good())
    with pytest.raises(UnknownTableError, match=r"no table named 'nope' in the config \(known: customers\)"):
        cfg.table("nope")
    assert cfg.table("customers").topic == "customers"
    path = tmp_path / "g.toml"
    path.write_text(GOOD.replace("{state}", str(tmp_path / "state")))
    for command in (["dump"], ["get", "some-key"], ["snapshots"], ["reset", "--yes"], ["migrate"]):
        assert cli.main([command[0], "--config", str(path), "--table", "nope", *command[1:]]) == 2, command
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines == ["globald: no table named 'nope' in the config (known: customers)"], (command, lines)
    assert not (tmp_path / "state").exists()
