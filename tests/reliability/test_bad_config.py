"""Invalid config values of every kind: one line naming the key, exit 2, nothing created.

Extends tests/unit/test_config.py (which runs its cases through subprocesses); these go through the CLI entry
point in-process, so that covering every key and every wrong type stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from globald.cli import main as cli
from tests.reliability.ledger import FaultRow

BASE = """state_dir = "{state}"
{top}
[kafka]
"bootstrap.servers" = "127.0.0.1:9092"
{kafka}
{sections}
[[tables]]
name = {name}
topic = {topic}
{extra_tables}
"""


def doc(top: str = "", kafka: str = "", sections: str = "", name: str = '"customers"', topic: str = '"customers"',
        extra_tables: str = "") -> str:
    return BASE.format(state="{state}", top=top, kafka=kafka, sections=sections, name=name, topic=topic,
                       extra_tables=extra_tables)


CASES: list[tuple[str, str, str]] = [
    # (case id, config text, key the message must name)
    ("export uri option pyarrow does not take",
     doc(sections='[export]\nuri = "s3://AKID:hunter2@bucket/x?region=us-east-1&request_timeout=1"'), "export.uri"),
    ("export uri unknown scheme", doc(sections='[export]\nuri = "nope://bucket/x"'), "export.uri"),
    ("state_dir empty", doc().replace('state_dir = "{state}"', 'state_dir = ""'), "state_dir"),
    ("commit_interval_ms string", doc(top='commit_interval_ms = "1000"'), "commit_interval_ms"),
    ("commit_interval_ms float", doc(top="commit_interval_ms = 1.5"), "commit_interval_ms"),
    ("commit_interval_ms bool", doc(top="commit_interval_ms = true"), "commit_interval_ms"),
    ("commit_interval_ms too small", doc(top="commit_interval_ms = 5"), "commit_interval_ms"),
    ("commit_interval_ms too large", doc(top="commit_interval_ms = 3600001"), "commit_interval_ms"),
    ("consume_batch_size zero", doc(top="consume_batch_size = 0"), "consume_batch_size"),
    ("consume_batch_size huge", doc(top="consume_batch_size = 1000001"), "consume_batch_size"),
    ("consume_batch_size array", doc(top="consume_batch_size = [1]"), "consume_batch_size"),
    ("poll_timeout_ms zero", doc(top="poll_timeout_ms = 0"), "poll_timeout_ms"),
    ("poll_timeout_ms huge", doc(top="poll_timeout_ms = 60001"), "poll_timeout_ms"),
    ("metadata_refresh_ms too small", doc(top="metadata_refresh_ms = 99"), "metadata_refresh_ms"),
    ("log_level number", doc(top="log_level = 5"), "log_level"),
    ("log_format xml", doc(top='log_format = "xml"'), "log_format"),
    ("store not a table", doc(top="store = 5"), "store"),
    ("store.block_cache_mb zero", doc(sections="[store]\nblock_cache_mb = 0"), "store.block_cache_mb"),
    ("store.write_buffer_mb huge", doc(sections="[store]\nwrite_buffer_mb = 65537"), "store.write_buffer_mb"),
    ("store.max_write_buffers one", doc(sections="[store]\nmax_write_buffers = 1"), "store.max_write_buffers"),
    ("store unknown key", doc(sections="[store]\ncache = 1"), "store.cache"),
    ("snapshots.interval_ms too small", doc(sections="[snapshots]\ninterval_ms = 9"), "snapshots.interval_ms"),
    ("snapshots.serve_stale string", doc(sections='[snapshots]\nserve_stale = "yes"'), "snapshots.serve_stale"),
    ("http.enabled string", doc(sections='[http]\nenabled = "no"'), "http.enabled"),
    ("http.host empty", doc(sections='[http]\nhost = ""'), "http.host"),
    ("http.port negative", doc(sections="[http]\nport = -1"), "http.port"),
    ("http.host beyond loopback", doc(sections='[http]\nhost = "0.0.0.0"'), "http.host"),
    ("http.allow_non_loopback string", doc(sections='[http]\nallow_non_loopback = "yes"'), "http.allow_non_loopback"),
    ("hooks.on_state_change string", doc(sections='[hooks]\non_state_change = "notify"'), "hooks.on_state_change"),
    ("hooks.on_state_change empty arg", doc(sections='[hooks]\non_state_change = [""]'), "hooks.on_state_change"),
    ("hooks.on_state_change number", doc(sections="[hooks]\non_state_change = [1]"), "hooks.on_state_change"),
    ("hooks.webhook_url ftp", doc(sections='[hooks]\nwebhook_url = "ftp://x"'), "hooks.webhook_url"),
    ("hooks.webhook_url number", doc(sections="[hooks]\nwebhook_url = 5"), "hooks.webhook_url"),
    ("hooks.timeout_ms zero", doc(sections="[hooks]\ntimeout_ms = 0"), "hooks.timeout_ms"),
    ("kafka not a table", doc().replace('[kafka]\n"bootstrap.servers" = "127.0.0.1:9092"', 'kafka = "x"'), "kafka"),
    ("kafka value array", doc(kafka='"client.id" = [1]'), "kafka.client.id"),
    ("kafka value table", doc(kafka='"client.id" = {a = 1}'), "kafka.client.id"),
    ("kafka enable.auto.commit", doc(kafka='"enable.auto.commit" = true'), "kafka.enable.auto.commit"),
    ("kafka enable.partition.eof", doc(kafka='"enable.partition.eof" = false'), "kafka.enable.partition.eof"),
    ("kafka bootstrap empty", doc().replace('= "127.0.0.1:9092"', '= ""'), "kafka.bootstrap.servers"),
    ("tables not a list", doc(top='tables = "customers"').split("[[tables]]")[0], "tables"),
    ("tables entry a number", doc(top="tables = [1]").split("[[tables]]")[0], "tables[0]"),
    ("table without topic", doc().replace('topic = "customers"', ""), "tables[0].topic"),
    ("table without name", doc().replace('name = "customers"', ""), "tables[0].name"),
    ("table name empty", doc(name='""'), "tables[0].name"),
    ("table name number", doc(name="5"), "tables[0].name"),
    ("table name too long", doc(name='"' + "a" * 129 + '"'), "tables[0].name"),
    ("table name hidden", doc(name='".hidden"'), "tables[0].name"),
    ("table name leading dash", doc(name='"-x"'), "tables[0].name"),
    ("table name space", doc(name='"a b"'), "tables[0].name"),
    ("table name unicode", doc(name='"café"'), "tables[0].name"),
    ("table name NUL", doc(name='"a\\u0000b"'), "tables[0].name"),
    ("table name backslash", doc(name='"a\\\\b"'), "tables[0].name"),
    ("table unknown key", doc(extra_tables="partitions = 3"), "tables[0].partitions"),
    ("topic too long", doc(topic='"' + "t" * 250 + '"'), "tables[0].topic"),
    ("topic dot", doc(topic='"."'), "tables[0].topic"),
    ("topic dotdot", doc(topic='".."'), "tables[0].topic"),
    ("topic mirrored twice", doc(extra_tables='[[tables]]\nname = "b"\ntopic = "customers"'), "tables[1].topic"),
]


ROW = "invalid config value (every key, every wrong type)"
EXPECTED = "one line naming the key, exit 2, nothing created"
PREFIX = "globald: config error: "


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str | None]:
    """Exit code, stderr lines, and the key the message names."""
    code = cli.main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    named = lines[0].removeprefix(PREFIX).split(": ")[0] if lines and lines[0].startswith(PREFIX) else None
    return code, lines, named


@pytest.mark.parametrize(("case", "text", "key"), CASES, ids=[c[0] for c in CASES])
def test_invalid_value_names_its_key_exits_2_and_creates_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fault: Callable[[str, str], FaultRow],
        case: str, text: str, key: str) -> None:
    row = fault(ROW, EXPECTED)
    state = tmp_path / "state"
    cfg = tmp_path / "globald.toml"
    cfg.write_text(text.replace("{state}", str(state)))
    code, lines, named = _run(["check-config", "--config", str(cfg)], capsys)
    row.injected += 1
    assert code == 2 and len(lines) == 1 and named == key, (code, lines)
    # The same validation stands before the daemon: `run` refuses without touching anything.
    code, lines, named = _run(["run", "--config", str(cfg)], capsys)
    assert code == 2 and len(lines) == 1 and named == key, (code, lines)
    assert not state.exists()


@pytest.mark.parametrize("what", ["not UTF-8", "a directory", "empty"])
def test_unreadable_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                fault: Callable[[str, str], FaultRow], what: str) -> None:
    row = fault(ROW, EXPECTED)
    cfg = tmp_path / "globald.toml"
    if what == "not UTF-8":
        cfg.write_bytes(b'state_dir = "\xff\xfe"\n')
    elif what == "a directory":
        cfg.mkdir()
    else:
        cfg.write_text("")
    code, lines, named = _run(["check-config", "--config", str(cfg)], capsys)
    row.injected += 1
    assert code == 2 and len(lines) == 1, (code, lines)
    assert named == ("--config" if what != "empty" else "state_dir"), lines
