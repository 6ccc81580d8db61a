"""The commands as a newcomer meets them (issue 14): one exit-code table, one line per error, no traceback.

Every test runs the real CLI as a subprocess (``python -m globald``) against real RocksDB stores built with globald's
own TableStore; none needs a broker (the daemon refuses a bad or owned state_dir before it talks to Kafka).
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from globald.cli.main import TABLE_HELP
from globald.common import exitcodes
from globald.store.names import db_dir
from globald.store.statedir import lock_state_dir
from tests.ci import require_tool
from tests.harness import REPO, globald, write_config
from tests.unit.test_formats import _bump_format
from tests.unit.test_read_view import fill, mark_complete

KAFKA = {"bootstrap.servers": "127.0.0.1:9"}  # never reached: nothing here needs a broker
COMMANDS = ("run", "status", "get", "dump", "snapshots", "reset", "migrate", "import-kafka-streams", "check-config",
            "demo", "dev", "reload")


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, (r.args, r.returncode, r.stderr)
    return lines[0]


@pytest.fixture
def complete(tmp_path: Path) -> tuple[Path, str]:
    """A state_dir with a complete store for table tbl ({a: 1, b: 2}); table other has no store."""
    state = tmp_path / "state"
    fill(state, {b"a": b"1", b"b": b"2"}, {0: 2}).close()
    mark_complete(state)
    # http.port 0 (any free port): on 9464, the default, `run` is refused first for a port another test's daemon
    # holds (two pytest workers) rather than for what the test is about.
    cfg = write_config(tmp_path / "globald.toml", state, KAFKA, {"tbl": "topic", "other": "topic2"}, http={"port": 0})
    return state, str(cfg)


def test_the_exit_code_table_is_the_docs_and_help_shows_it() -> None:
    page = (REPO / "docs" / "reference" / "cli.md").read_text()
    section = page[page.index("## Exit codes"):]
    rows = re.findall(r"^\| (\d+) \| ([^|]+?) \|", section, flags=re.M)
    assert [(int(c), m) for c, m in rows] == [(code, name) for code, name, _ in exitcodes.TABLE]
    r = globald("--help")
    assert r.returncode == 0
    for code, name, _ in exitcodes.TABLE:
        assert re.search(rf"^  {code}\s+{name}$", r.stdout, flags=re.M), r.stdout


def test_every_command_exits_by_the_table(complete: tuple[Path, str], tmp_path: Path) -> None:
    state, cfg = complete
    ok = [("get", "--table", "tbl", "a"), ("dump", "--table", "tbl"), ("check-config",),
          ("migrate", "--table", "tbl")]
    for args in ok:
        r = globald(args[0], "--config", cfg, *args[1:])
        assert r.returncode == exitcodes.OK, (args, r.stderr)

    expected: list[tuple[tuple[str, ...], int, str]] = [
        (("get", "--table", "tbl", "zz"), exitcodes.NOT_FOUND, "not found"),
        (("snapshots", "--table", "tbl"), exitcodes.NOT_FOUND, "has no snapshot"),
        (("snapshots", "--table", "other"), exitcodes.NOT_FOUND, "no store either"),
        (("dump", "--table", "tbl", "--snapshot", "1700000000000001"), exitcodes.NOT_FOUND, "1700000000000001"),
        (("get", "--table", "tbl", "--key-format", "hex", "zz"), exitcodes.USAGE, "KEY 'zz' is not valid hex"),
        (("get", "--table", "tbl", "--key-format", "base64", "%%"), exitcodes.USAGE, "KEY '%%' is not valid base64"),
        (("get", "--table", "nope", "a"), exitcodes.USAGE, "nope"),
        (("get", "--table", "other", "a"), exitcodes.UNAVAILABLE, "no consistent version"),
        (("reset", "--table", "tbl"), exitcodes.REFUSED, "--yes"),
        (("reload",), exitcodes.FAILED, "no globald runs on state_dir"),
        # status with no daemon: the offsets on disk, and which state_dir no daemon holds (issue 42)
        (("status",), exitcodes.FAILED, f"no globald runs on state_dir {state} ({cfg}'s state_dir; no process "
                                         "holds its lock)"),
    ]
    for args, code, says in expected:
        r = subprocess.run([sys.executable, "-m", "globald", args[0], "--config", cfg, *args[1:]],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert r.returncode == code and says in one_line(r), (args, code, r.returncode, r.stderr)
        assert "config error" not in r.stderr or code == exitcodes.USAGE
    r = globald("status", "--config", cfg)  # what the stores on disk say is still shown
    assert r.stdout.splitlines()[:2] == ["globald: NOT_RUNNING", "  tbl                  NOT_RUNNING  p0=2"], r.stdout

    # A second daemon and an offline command on an owned state_dir are refused, naming the owner; nothing changes.
    lock = lock_state_dir(state)
    try:
        for args in (("run",), ("migrate",)):
            r = globald(args[0], "--config", cfg, *args[1:])
            assert r.returncode == exitcodes.REFUSED and f"pid {os.getpid()}" in one_line(r), (args, r.stderr)
        # The lock held and no status published: a daemon starting, said as such; its stores are not opened.
        r = globald("status", "--config", cfg)
        assert r.returncode == exitcodes.UNAVAILABLE and f"(pid {os.getpid()}) is starting on state_dir {state}" \
            in one_line(r), r.stderr
    finally:
        lock.close()

    # Usage errors, argparse's and the config's, are 2 too.
    assert globald("get", "--config", cfg).returncode == exitcodes.USAGE
    bad = tmp_path / "bad.toml"
    bad.write_text(Path(cfg).read_text().replace("[kafka]", "commit_interval_ms = -1\n[kafka]"))
    r = globald("status", "--config", str(bad))
    assert r.returncode == exitcodes.USAGE and "commit_interval_ms" in one_line(r)

    # A store this globald cannot use: a runtime failure, reported and left alone.
    _bump_format(db_dir(state, "tbl"), 999)
    r = globald("migrate", "--config", cfg, "--table", "tbl")
    assert r.returncode == exitcodes.FAILED and "newer than this globald reads" in r.stdout, r.stdout + r.stderr


def test_version_and_help_describe_every_command() -> None:
    from importlib.metadata import version

    r = globald("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"globald {version('globald')}"
    for command in COMMANDS:
        r = globald(command, "--help")
        assert r.returncode == 0, r.stderr
        # usage lines, a blank line, then the description: a sentence saying what the command does
        description = r.stdout.split("\n\n")[1].strip()
        assert description[0].isupper() and description.endswith(".") and len(description) > 20, (command, r.stdout)
        assert "exit codes:" in r.stdout
        if "--table NAME" in r.stdout:
            assert TABLE_HELP in " ".join(r.stdout.split()), (command, r.stdout)


def test_check_config_tries_what_run_needs_of_the_state_dir(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for state_dir in (a_file / "state", Path("/proc/globald-check"), Path("/sys/globald-check"), a_file):
        cfg = write_config(tmp_path / "g.toml", state_dir, KAFKA, {"tbl": "topic"}, http={"port": 0})  # see complete
        for command in ("check-config", "run"):  # refused by check-config exactly where run refuses it
            r = globald(command, "--config", str(cfg))
            assert r.returncode == exitcodes.USAGE and f"state_dir {state_dir}" in one_line(r), (command, r.stderr)
    assert a_file.read_text() == "x"

    # A state_dir that does not exist yet: OK, and nothing is left behind, neither it nor the trial's scratch.
    parent = tmp_path / "fresh"
    parent.mkdir()
    cfg = write_config(tmp_path / "g.toml", parent / "deep" / "state", KAFKA, {"tbl": "topic"})
    r = globald("check-config", "--config", str(cfg))
    assert r.returncode == exitcodes.OK and list(parent.iterdir()) == [], (r.stderr, list(parent.iterdir()))

    # One a daemon holds: the config is fine, and the note says run would be refused while it runs.
    state = tmp_path / "held"
    state.mkdir(mode=0o700)
    cfg = write_config(tmp_path / "g.toml", state, KAFKA, {"tbl": "topic"})
    lock = lock_state_dir(state)
    try:
        before = sorted(p.name for p in state.iterdir())
        r = globald("check-config", "--config", str(cfg), "--json")
        assert r.returncode == exitcodes.OK, r.stderr
        assert f"pid {os.getpid()}" in json.loads(r.stdout)["state_dir_note"]
        assert sorted(p.name for p in state.iterdir()) == before
    finally:
        lock.close()


def _as_a_stranger(args: list[str]) -> list[str]:
    """``args`` run by someone the state_dir's permissions keep out. As root (which passes every permission check),
    that is root without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH, on a state_dir owned by nobody (65534)."""
    if os.geteuid() != 0:
        return args
    # util-linux, in every Debian: missing, the test skips here and fails in CI.
    setpriv = require_tool("setpriv", "util-linux")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *args]


def test_a_state_dir_the_user_may_not_read_is_one_line_for_every_command(complete: tuple[Path, str]) -> None:
    state, cfg = complete
    if os.geteuid() == 0:
        for p in [state, *state.rglob("*")]:
            os.chown(p, 65534, 65534, follow_symlinks=False)
    state.chmod(0o700 if os.geteuid() == 0 else 0o000)
    try:
        for args in (["status"], ["get", "--table", "tbl", "a"], ["dump", "--table", "tbl"],
                     ["snapshots", "--table", "tbl"], ["reset", "--table", "tbl", "--yes"], ["migrate"],
                     ["check-config"], ["run"]):
            r = subprocess.run(_as_a_stranger([sys.executable, "-m", "globald", args[0], "--config", cfg, *args[1:]]),
                               capture_output=True, text=True, timeout=60, cwd=REPO)
            line = one_line(r)
            assert r.returncode == exitcodes.USAGE and str(state) in line, (args, r.returncode, r.stderr)
            assert "Permission denied" in line or "not writable" in line, (args, line)
    finally:
        state.chmod(0o700)


def test_dump_text_form_is_readable_and_escaped_as_json(tmp_path: Path) -> None:
    state = tmp_path / "state"
    values = {b"plain": b"value", "café".encode(): "naïve ☕".encode(), b'quote"back\\slash': b"line\nnext\ttab\x1b",
              b"\xff\xfe": b"\x00\x01", b"bin-value": b"\x80ok"}
    fill(state, values, {0: len(values)}).close()
    mark_complete(state)
    cfg = str(write_config(tmp_path / "g.toml", state, KAFKA, {"tbl": "topic"}))
    r = globald("dump", "--config", cfg, "--table", "tbl", "--format", "text")
    assert r.returncode == 0, r.stderr

    def doc_line(fields: str) -> str:
        return "{" + fields + ', "timestamp": 1700000000000}'

    assert r.stdout.splitlines() == [  # RocksDB order: bytewise
        doc_line('"key": "bin-value", "value_base64": "gG9r"'),  # not UTF-8: base64, under its own name
        doc_line('"key": "café", "value": "naïve ☕"'),
        doc_line('"key": "plain", "value": "value"'),
        doc_line('"key": "quote\\"back\\\\slash", "value": "line\\nnext\\ttab\\u001b"'),
        doc_line('"key_base64": "//4=", "value": "\\u0000\\u0001"'),  # control characters are UTF-8, escaped
    ]
    r = globald("dump", "--config", cfg, "--table", "tbl")  # the default stays exact base64 for any bytes
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert {base64.b64decode(d["key"]): base64.b64decode(d["value"]) for d in docs} == values


def test_a_relative_state_dir_is_taken_from_the_config_files_directory(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "elsewhere").mkdir()
    cfg = tmp_path / "conf" / "g.toml"
    cfg.write_text('state_dir = "state"\n[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n'
                   '[[tables]]\nname = "tbl"\ntopic = "topic"\n')
    r = subprocess.run([sys.executable, "-m", "globald", "check-config", "--config", "../conf/g.toml", "--json"],
                       cwd=tmp_path / "elsewhere", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["state_dir"] == str(tmp_path / "conf" / "state"), r.stderr
    example = (REPO / "config" / "globald.toml").read_text()
    assert "A relative state_dir resolves against the directory of this config file" in example
    running = " ".join((REPO / "docs" / "operations" / "running.md").read_text().split())
    assert "A relative `state_dir` is taken from the config file's directory" in running


def test_make_demo_says_where_globald_is() -> None:
    r = subprocess.run(["make", "-n", "demo"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "source .venv/bin/activate" in r.stdout and ".venv/bin/globald" in r.stdout


@pytest.mark.timeout(180)
def test_building_the_package_prints_no_license_deprecation(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(REPO)],
                       capture_output=True, text=True, timeout=170)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "project.license" not in r.stdout + r.stderr and "License classifiers are deprecated" not in r.stderr
    assert list(tmp_path.glob("globald-*.whl"))


def test_plain_get_of_a_typed_table_says_on_stderr_that_decode_exists(tmp_path: Path) -> None:
    """Issue 35, item 3: the stored bytes on stdout as before (scripts parse it), and a hint beside them."""
    state = tmp_path / "state"
    fill(state, {b"k": b'{"a": 1}'}, {0: 1}).close()
    mark_complete(state)
    (tmp_path / "s.ddl").write_text("a BIGINT")
    cfg = write_config(tmp_path / "g.toml", state, KAFKA, {"tbl": "topic"})
    raw_cfg = str(cfg)
    typed = tmp_path / "typed.toml"
    typed.write_text(cfg.read_text() + '[tables.value]\nformat = "json"\nschema = "s.ddl"\n')
    stored = 'value:     {"a": 1}\ntimestamp: 2023-11-14T22:13:20.000Z (1700000000000)\n'
    r = globald("get", "--config", str(typed), "--table", "tbl", "k")
    assert r.returncode == 0 and r.stdout == stored, (r.stdout, r.stderr)
    assert r.stderr == ("globald: tbl's values are json (the stored bytes are shown): add --decode to print them "
                        "decoded\n")
    r = globald("get", "--config", str(typed), "--table", "tbl", "--decode", "k")
    assert r.returncode == 0 and '"a": 1' in r.stdout and "--decode" not in r.stderr, (r.stdout, r.stderr)
    r = globald("get", "--config", raw_cfg, "--table", "tbl", "k")  # a raw table: its bytes are the answer
    assert r.returncode == 0 and r.stdout == stored and r.stderr == "", (r.stdout, r.stderr)


def test_a_misspelt_kafka_property_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "state"}"\n[kafka]\n"bootstrap.server" = "127.0.0.1:9"\n'
                   '[[tables]]\nname = "tbl"\ntopic = "topic"\n')
    r = globald("check-config", "--config", str(cfg))
    assert r.returncode == 2
    assert one_line(r) == ("globald: config error: kafka.bootstrap.servers: is required (is 'bootstrap.server' a "
                           "misspelling of it?)")
