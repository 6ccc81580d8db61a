"""The walkthrough of ``docs/typed-tables.md`` ("Try it on `globald dev`"), executed as written (issue 35, item 3).

As the tutorial's test (``test_newcomer_tutorial``, whose terminal and matching helpers this reuses): every
``console`` block's ``$`` lines run in bash after ``source .venv/bin/activate``, their output must match the page's
once what changes from run to run is normalised, ``globald dev`` and ``globald run`` stay up in terminals of their
own until the closing Ctrl-C. A block with a ``title="PATH"`` is a file the reader saves: it is written to PATH, as
shown, before the next command runs. Only that section runs: the page's other examples name files of a production
host.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from globald.cli.dev import READY_LINE
from tests.harness import REPO
from tests.integration.test_newcomer_tutorial import SETTLE_S, VENV, Block, Terminal, commands, in_order, same, shell

pytestmark = pytest.mark.kafka

PAGE = REPO / "docs" / "typed-tables.md"
SECTION = "## Try it on `globald dev`"
DEV_DIR = "typed-dev"


def section() -> str:
    text = PAGE.read_text()
    assert SECTION in text, f"{PAGE} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    return body.split("\n## ", 1)[0]


def blocks() -> list[tuple[Block, str | None]]:
    return [(Block(kind, body.splitlines()), title or None) for kind, title, body in
            re.findall(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', section(), flags=re.S | re.M)]


def local(lines: list[str]) -> list[str]:
    """The absolute directory the reader ran in, wherever it is."""
    return [re.sub(rf"\S*/{DEV_DIR}/", f"DIR/{DEV_DIR}/", line) for line in lines]


@pytest.mark.long  # a broker, a daemon and a snapshot's decode: over 30 s on an idle 2-core machine
def test_the_typed_walkthrough_runs_as_written(tmp_path: Path) -> None:
    steps = blocks()
    assert [b.kind for b, _ in steps].count("console") >= 5, "the walkthrough's blocks are not where expected"
    cwd = tmp_path / "clone"
    cwd.mkdir()
    (cwd / ".venv").symlink_to(VENV)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != (VENV / "bin").resolve())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = path
    terminals: dict[str, Terminal] = {}
    ran: list[str] = []
    try:
        for block, title in steps:
            if title is not None:  # a file the reader saves
                (cwd / title).write_text("\n".join(block.lines) + "\n")
                ran.append(f"save {title}")
                continue
            if block.kind != "console":
                continue
            for cmd in commands(block):
                ran.append(cmd.command)
                if cmd.command.startswith("globald dev "):
                    t = terminals["dev"] = Terminal(cwd, env, cmd.command, "dev")
                    lines = t.wait_for(lambda lines: any(READY_LINE in line for line in lines), "out",
                                       "globald dev ready", timeout=180)
                    assert same(cmd.expected, lines), "\n".join(lines)
                elif cmd.command.startswith("globald run "):
                    t = terminals["run"] = Terminal(cwd, env, cmd.command, "run")
                    t.wait_for(lambda lines, c=cmd: in_order(c.expected, lines), "err", "globald run output",
                               timeout=120)
                else:
                    deadline = time.monotonic() + SETTLE_S
                    while True:  # get answers once the table's store and its snapshot are complete: look again
                        r = shell(cwd, env, cmd.command)
                        done = r.returncode == 0 and same(local(cmd.expected), local(r.stdout.splitlines()))
                        if done or time.monotonic() > deadline:
                            break
                        time.sleep(0.5)
                    assert r.returncode == 0, (cmd.command, r.returncode, r.stdout, r.stderr)
                    assert same(local(cmd.expected), local(r.stdout.splitlines())), (cmd.command, r.stdout,
                                                                                    cmd.expected)
                    assert "CONFWARN" not in r.stderr, r.stderr  # produce.py's client is quiet, as the page says

        # What the prose promises: plain get shows the stored bytes and names --decode on stderr only.
        r = shell(cwd, env, f"globald get --config {DEV_DIR}/globald.toml --table customers_avro cust-1")
        assert r.returncode == 0 and r.stdout.startswith("value:     \x00\x00\x00\x00\x01"), (r.stdout, r.stderr)
        assert "add --decode to print them decoded" in r.stderr and "--decode" not in r.stdout
        assert terminals["run"].ctrl_c() == 0
        assert terminals["dev"].ctrl_c() == 0
        removed = f"globald dev: stopped; {DEV_DIR} removed"
        assert f"`{removed}`" in section() and terminals["dev"].lines()[-1] == removed
        assert not (cwd / DEV_DIR).exists()
    finally:
        for t in reversed(list(terminals.values())):
            t.stop()
    assert ran[0] == f"globald dev --dir {DEV_DIR} --topic customers-avro", ran
    assert {"python produce.py", "save produce.py", f"cat customers-avro.toml >> {DEV_DIR}/globald.toml"} <= set(ran)


def test_a_table_from_the_pages_contract_block_is_accepted_for_avro(tmp_path: Path) -> None:
    """The contract block at the top of the page pastes as is (its protobuf-only line is a comment)."""
    text = PAGE.read_text()
    block = re.search(r"^## The contract\n+```toml\n(.*?)^```$", text, flags=re.S | re.M)
    assert block, "no toml block under The contract"
    (tmp_path / "schemas" / "ids").mkdir(parents=True)
    schema = (REPO / "docs" / "typed-tables.md").read_text().split('```json title="typed-dev/schemas/customer.avsc"\n')
    (tmp_path / "schemas" / "customer.avsc").write_text(schema[1].split("```")[0])
    (tmp_path / "schemas" / "ids" / "1.avsc").write_text(schema[1].split("```")[0])
    cfg = tmp_path / "globald.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "state"}"\n[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n'
                   + block[1])
    r = subprocess.run([str(VENV / "bin" / "globald"), "check-config", "--config", str(cfg)], capture_output=True,
                       text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
