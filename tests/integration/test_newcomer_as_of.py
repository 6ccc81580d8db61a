"""The worked example of versioned tables (``docs/as-of-example.md``, exchange rates at trade time), executed as
written on ``globald dev --broker tansu`` (issue 45: "a docs page tells the story with a worked example that a test
runs as written, on the `globald dev` broker").

As the tutorial's test (whose terminal, matching and PySpark helpers this reuses): every ``console`` block's ``$``
lines run in bash after ``source .venv/bin/activate``, and what they print (stdout and stderr, as a terminal shows
both) must match the page's once normalised; a command is asked again for up to ``SETTLE_S`` while it does not
match yet (the daemon restores the rates a moment after it starts). ``globald dev`` and ``globald run`` stay up in
terminals of their own until the page's Ctrl-Cs (``background``); a block with a ``title`` is a file the reader
saves under that name; the untitled ``python`` block is fed to the real ``pyspark`` shell.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.harness import REPO
from tests.integration.test_newcomer_reload import clone
from tests.integration.test_newcomer_tutorial import (
    SETTLE_S,
    Block,
    Terminal,
    background,
    commands,
    pyspark,
    same,
    shell,
)

pytestmark = [pytest.mark.kafka, pytest.mark.tansu, pytest.mark.spark]

PAGE = REPO / "docs" / "as-of-example.md"
BLOCK = re.compile(r'^```(\w+)(?: title="([^"]+)")?\n(.*?)^```$', flags=re.S | re.M)


def page_blocks() -> list[tuple[Block, str | None]]:
    """The page's fenced blocks in order, each with its title (the file name a reader saves it as) or None."""
    return [(Block(kind, body.splitlines()), title or None) for kind, title, body in BLOCK.findall(PAGE.read_text())]


def settle(cwd: Path, env: dict[str, str], command: str, expected: list[str]) -> None:
    deadline = time.monotonic() + SETTLE_S
    while True:
        r = shell(cwd, env, f"{{ {command}; }} 2>&1")
        if (r.returncode == 0 and same(expected, r.stdout.splitlines())) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert r.returncode == 0 and same(expected, r.stdout.splitlines()), (command, r.returncode, r.stdout, expected)


@pytest.mark.long  # a broker, a daemon and a PySpark shell: about 30 s on an idle 2-core machine
def test_the_exchange_rates_example_runs_as_written(tmp_path: Path) -> None:
    cwd, env = clone(tmp_path)
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    terminals: dict[str, Terminal] = {}
    ran: list[str] = []
    try:
        for block, title in page_blocks():
            if title is not None:  # a file the page asks to save
                (cwd / title).write_text("\n".join(block.lines) + "\n")
                ran.append(f"saved {title}")
            elif block.kind == "python":  # what the reader pastes into the shell `$ pyspark` just started
                assert ran[-1:] == ["pyspark"], f"a python block must follow `$ pyspark`, not {ran[-1:]}"
                pyspark(cwd, env, block)
                ran.append("pyspark < python block")
            elif block.kind == "console":
                for cmd in commands(block):
                    ran.append(cmd.command)
                    if cmd.command != "pyspark" and not background(cwd, env, cmd, terminals):
                        settle(cwd, env, cmd.command, cmd.expected)
        # The page's last step: Ctrl-C in terminal 2, then in terminal 1.
        assert terminals["run"].ctrl_c() == 0
        assert terminals["dev"].ctrl_c() == 0
        removed = "globald dev: stopped; globald-dev removed"
        assert f"`{removed}`" in PAGE.read_text() and terminals["dev"].lines()[-1] == removed
        assert terminals["dev"].lines("err") == [], terminals["dev"].lines("err")
    finally:
        for t in reversed(list(terminals.values())):
            t.stop()
    assert ran[:2] == ["source .venv/bin/activate", "globald dev --broker tansu --topic fx-rates --topic-config "
                       "min.compaction.lag.ms=315360000000"], ran
    assert {"saved rates.toml", "saved produce_rates.py", "pyspark < python block"} <= set(ran), ran
    assert any("--as-of 2026-11-02T12:00:00Z" in c for c in ran), ran  # the trade before since
