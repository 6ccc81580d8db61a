"""The walkthroughs of ``docs/typed-tables.md`` ("Try it on `globald dev`", issue 35 item 3, and "Try the Schema
Registry on `globald dev`", issue 42 item 3), executed as written.

As the tutorial's test (``test_newcomer_tutorial``, whose terminal and matching helpers this reuses): every
``console`` block's ``$`` lines run in bash after ``source .venv/bin/activate``, their output must match the page's
once what changes from run to run is normalised, ``globald dev`` and ``globald run`` stay up in terminals of their
own until the closing Ctrl-C. A block with a ``title="PATH"`` is a file the reader saves: it is written to PATH, as
shown, before the next command runs; a ``text`` block is more of the daemon's log. Only those sections run: the
page's other examples name files of a production host.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from globald.cli.dev import READY_LINE
from tests.harness import REPO
from tests.integration.test_newcomer_tutorial import (
    SETTLE_S,
    VENV,
    Block,
    Command,
    Terminal,
    commands,
    in_order,
    same,
    shell,
)

pytestmark = pytest.mark.kafka

PAGE = REPO / "docs" / "typed-tables.md"
SECTION = "## Try it on `globald dev`"
DEV_DIR = "typed-dev"
REGISTRY_SECTION = "## Try the Schema Registry on `globald dev`"
REGISTRY_DIR = "registry-dev"


def section(title: str = SECTION) -> str:
    text = PAGE.read_text()
    assert title in text, f"{PAGE} has no section {title!r}"
    body = text.split(title, 1)[1]
    return body.split("\n## ", 1)[0]


def blocks(title: str = SECTION) -> list[tuple[Block, str | None]]:
    return [(Block(kind, body.splitlines()), path or None) for kind, path, body in
            re.findall(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', section(title), flags=re.S | re.M)]


def local(lines: list[str], dev_dir: str = DEV_DIR) -> list[str]:
    """The absolute directory the reader ran in, wherever it is."""
    return [re.sub(rf"\S*/{dev_dir}/", f"DIR/{dev_dir}/", line) for line in lines]


class Walkthrough:
    """One ``Try ...`` section of the page, run as a reader runs it, in ``tmp_path/clone``: ``console`` blocks run
    (``globald dev`` and ``globald run`` in terminals of their own), titled blocks are saved to their path, ``text``
    blocks are more of the daemon's log. ``stop()`` is the page's closing Ctrl-Cs."""

    def __init__(self, tmp_path: Path, title: str, dev_dir: str) -> None:
        self.title, self.dev_dir = title, dev_dir
        self.cwd = tmp_path / "clone"
        self.cwd.mkdir()
        (self.cwd / ".venv").symlink_to(VENV)
        path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                               if p and Path(p).resolve() != (VENV / "bin").resolve())
        self.env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
        self.env["PATH"] = path
        self.terminals: dict[str, Terminal] = {}
        self.ran: list[str] = []

    def run(self) -> None:
        for block, title in blocks(self.title):
            if title is not None:  # a file the reader saves
                (self.cwd / title).write_text("\n".join(block.lines) + "\n")
                self.ran.append(f"save {title}")
            elif block.kind == "text":  # more of the daemon's log
                self.terminals["run"].wait_for(lambda lines, b=block: in_order(self.local(b.lines), self.local(lines)),
                                               "err", "the daemon's log lines the page shows", timeout=SETTLE_S)
            elif block.kind == "console":
                for cmd in commands(block):
                    self.ran.append(cmd.command)
                    self.command(cmd)

    def local(self, lines: list[str]) -> list[str]:
        return local(lines, self.dev_dir)

    def command(self, cmd: Command) -> None:
        if cmd.command.startswith("globald dev "):
            t = self.terminals["dev"] = Terminal(self.cwd, self.env, cmd.command, "dev")
            lines = t.wait_for(lambda lines: any(READY_LINE in line for line in lines), "out", "globald dev ready",
                               timeout=180)
            assert same(cmd.expected, lines), "\n".join(lines)
        elif cmd.command.startswith("globald run "):
            t = self.terminals["run"] = Terminal(self.cwd, self.env, cmd.command, "run")
            t.wait_for(lambda lines, c=cmd: in_order(c.expected, lines), "err", "globald run output", timeout=120)
        else:
            deadline = time.monotonic() + SETTLE_S
            while True:  # get answers once the table's store and its snapshot are complete: look again
                r = shell(self.cwd, self.env, cmd.command)
                done = r.returncode == 0 and same(self.local(cmd.expected), self.local(r.stdout.splitlines()))
                if done or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            log = "\n".join(self.terminals["run"].lines("err")[-20:]) if "run" in self.terminals else ""
            assert done, (f"{cmd.command}: exit {r.returncode}\n{r.stdout}{r.stderr}\nexpected:\n"
                          + "\n".join(cmd.expected) + f"\nthe daemon's log:\n{log}")
            assert "CONFWARN" not in r.stderr, r.stderr  # the producers' clients are quiet, as the page says

    def stop(self) -> None:
        """The page's closing Ctrl-Cs: the daemon's, then globald dev's, which removes its directory."""
        assert self.terminals["run"].ctrl_c() == 0
        assert self.terminals["dev"].ctrl_c() == 0
        removed = f"globald dev: stopped; {self.dev_dir} removed"
        assert f"`{removed}`" in section(self.title) and self.terminals["dev"].lines()[-1] == removed
        assert not (self.cwd / self.dev_dir).exists()

    def close(self) -> None:
        for t in reversed(list(self.terminals.values())):
            t.stop()


@pytest.mark.long  # a broker, a daemon and a snapshot's decode: over 30 s on an idle 2-core machine
def test_the_typed_walkthrough_runs_as_written(tmp_path: Path) -> None:
    steps = blocks()
    assert [b.kind for b, _ in steps].count("console") >= 5, "the walkthrough's blocks are not where expected"
    walk = Walkthrough(tmp_path, SECTION, DEV_DIR)
    try:
        walk.run()
        # What the prose promises: plain get shows the stored bytes and names --decode on stderr only.
        r = shell(walk.cwd, walk.env, f"globald get --config {DEV_DIR}/globald.toml --table customers_avro cust-1")
        assert r.returncode == 0 and r.stdout.startswith("value:     \x00\x00\x00\x00\x01"), (r.stdout, r.stderr)
        assert "add --decode to print them decoded" in r.stderr and "--decode" not in r.stdout
        walk.stop()
    finally:
        walk.close()
    ran = walk.ran
    assert ran[0] == f"globald dev --dir {DEV_DIR} --topic customers-avro", ran
    assert {"python produce.py", "save produce.py", f"cat customers-avro.toml >> {DEV_DIR}/globald.toml"} <= set(ran)


@pytest.mark.long  # over 15 s on an idle 2-core machine: the long lane (make test-long)
def test_the_registry_walkthrough_runs_as_written(tmp_path: Path) -> None:
    """``globald dev --registry``, a table whose schemas come from it, a producer registering a new writer schema
    while the daemon runs, both versions decoding, the reload moving the reader: the page's section as written. The
    registry lives and dies with ``globald dev``: after its Ctrl-C nothing answers on its port."""
    walk = Walkthrough(tmp_path, REGISTRY_SECTION, REGISTRY_DIR)
    try:
        walk.run()
        port = int(re.search(r"registry: http://127\.0\.0\.1:(\d+) ", "\n".join(walk.terminals["dev"].lines()))[1])
        walk.stop()
    finally:
        walk.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    ran = walk.ran
    assert ran[0] == f"globald dev --dir {REGISTRY_DIR} --topic customers-avro --registry", ran
    new_version = [c for c in ran if c.startswith(f"python {REGISTRY_DIR}/produce.py --schema ")]
    assert new_version and ran.index(new_version[0]) > ran.index(f"globald run --config {REGISTRY_DIR}/globald.toml")
    assert f"globald reload --config {REGISTRY_DIR}/globald.toml" in ran


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
