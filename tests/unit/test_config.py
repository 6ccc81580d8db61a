"""Invalid config: one line naming the key, exit 2, nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest

from globald.config import load, redact
from globald.errors import ConfigError
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
