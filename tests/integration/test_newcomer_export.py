"""The walkthrough of ``docs/operations/export.md`` ("Try it on `globald dev`"), executed as written (issue 42 item 1):
export from one daemon, bootstrap a second from it on the same machine, see ``origin`` export.

As the reload page's test (``test_newcomer_reload``, whose section reader this reuses, with the tutorial's terminal
and matching helpers): every ``console`` block's ``$`` lines run in bash after ``source .venv/bin/activate``, their
output must match the page's once what changes from run to run is normalised (asked again for up to ``SETTLE_S``);
``globald dev`` and each ``globald run`` stay up in terminals of their own, and the page's closing Ctrl-Cs end them.
Beyond the page's lines, the second daemon's status document must say ``origin.kind`` export, and both daemons'
whole tables must be equal and not empty (the page's ``diff ... && echo same`` would also pass on two failed dumps).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from globald.cli.dev import READY_LINE, SECOND_CONFIG, TABLE
from tests.harness import REPO
from tests.integration.test_newcomer_reload import clone, settled, walkthrough
from tests.integration.test_newcomer_tutorial import Terminal, commands, in_order, same, shell

pytestmark = pytest.mark.kafka

PAGE = REPO / "docs" / "operations" / "export.md"
DEV_DIR = "export-dev"
FIRST, SECOND = f"{DEV_DIR}/globald.toml", f"{DEV_DIR}/{SECOND_CONFIG}"
_LOCAL = [
    (re.compile(rf"\S*/{DEV_DIR}/"), f"DIR/{DEV_DIR}/"),  # the absolute directory the reader ran in
    (re.compile(r"\b\d{16}-[0-9a-f]{8}\b"), "EXPORT-ID"),  # an export's id: time and a random tag
    (re.compile(r"\b\d+ bytes\b"), "N bytes"),  # what an export uploads depends on RocksDB's files of the run
    (re.compile(r"\b\d+\.\d+ s\)"), "N s)"),
    (re.compile(r"\bthen [\d,]+ offsets\b"), "then N offsets"),  # what daemon 1 wrote after its snapshot, if any
]


def local(lines: list[str]) -> list[str]:
    out = []
    for line in lines:
        for pattern, repl in _LOCAL:
            line = pattern.sub(repl, line)
        out.append(line)
    return out


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_the_export_walkthrough_runs_as_written(tmp_path: Path) -> None:
    prose, blocks = walkthrough(PAGE)
    cwd, env = clone(tmp_path)
    terminals: dict[str, Terminal] = {}  # by the command that started it
    ran: list[str] = []
    try:
        for block in blocks:
            for cmd in commands(block) if block.kind == "console" else []:
                ran.append(cmd.command)
                if cmd.command.startswith("globald dev "):
                    t = terminals[cmd.command] = Terminal(cwd, env, cmd.command, "dev")
                    t.wait_for(lambda lines, c=cmd: any(READY_LINE in line for line in lines) and
                               same(c.expected, lines), "out", cmd.command, timeout=180)
                    continue
                if cmd.command.startswith("globald run "):
                    t = terminals[cmd.command] = Terminal(cwd, env, cmd.command, f"run{len(terminals)}")
                    t.wait_for(lambda lines, c=cmd: in_order(local(c.expected), local(lines)), "err", cmd.command,
                               timeout=180)
                    continue
                r, done = settled(cwd, env, cmd.command, cmd.expected, local)
                logs = "\n".join(line for c, t in terminals.items() if c.startswith("globald run ")
                                 for line in [f"--- {c}", *t.lines("err")[-15:]])
                assert done, f"{cmd.command}: exit {r.returncode}\n{r.stdout}{r.stderr}\nthe daemons' logs:\n{logs}"
        _assert_the_second_daemon_came_from_the_export_and_holds_the_first_ones_table(cwd, env)
        for command in (f"globald run --config {SECOND}", f"globald run --config {FIRST}"):
            assert terminals[command].ctrl_c() == 0
        assert terminals[f"globald dev --dir {DEV_DIR} --export"].ctrl_c() == 0
        removed = f"globald dev: stopped; {DEV_DIR} removed"
        assert f"`{removed}`" in prose and terminals[f"globald dev --dir {DEV_DIR} --export"].lines()[-1] == removed
    finally:
        for t in reversed(list(terminals.values())):
            t.stop()
    assert not (cwd / DEV_DIR).exists()
    assert f"globald export --config {FIRST} --table {TABLE}" in ran and f"globald status --config {SECOND}" in ran


def _assert_the_second_daemon_came_from_the_export_and_holds_the_first_ones_table(cwd: Path,
                                                                                  env: dict[str, str]) -> None:
    r = shell(cwd, env, f"globald status --config {SECOND} --json")
    origin = json.loads(r.stdout)["tables"][TABLE]["origin"]
    assert r.returncode == 0 and origin["kind"] == "export" and origin["fallback"] is None, origin
    dumps = [shell(cwd, env, f"globald dump --config {c} --table {TABLE} --format text") for c in (FIRST, SECOND)]
    assert all(d.returncode == 0 for d in dumps), [d.stderr for d in dumps]
    assert dumps[0].stdout.count("\n") > 100 and dumps[0].stdout == dumps[1].stdout
