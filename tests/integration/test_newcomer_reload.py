"""The walkthrough of ``docs/operations/reload.md`` ("Try it on `globald dev`"), executed as written (issue 35 item 2).

As the tutorial's test (``test_newcomer_tutorial``, whose terminal and matching helpers this reuses): every
``console`` block's ``$`` lines run in bash after ``source .venv/bin/activate``; their output must match the page's
once what changes from run to run is normalised (a command is asked again for up to ``SETTLE_S``: a SIGHUP's reload
is seen a moment later); ``globald dev`` and ``globald run`` stay up in terminals of their own, ``text`` blocks are
more of the daemon's log, and the page's closing Ctrl-Cs end them.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from globald.cli.dev import READY_LINE
from tests.harness import REPO
from tests.integration.test_newcomer_tutorial import SETTLE_S, VENV, Block, Terminal, commands, in_order, same, shell

pytestmark = pytest.mark.kafka

PAGE = REPO / "docs" / "operations" / "reload.md"
SECTION = "## Try it on `globald dev`"
DEV_DIR = "reload-dev"


def walkthrough(page: Path = PAGE, section: str = SECTION) -> tuple[str, list[Block]]:
    """A page's section (the export page's too): its prose, and its fenced blocks in order."""
    text = page.read_text()
    assert section in text, f"{page} has no section {section!r}"
    body = text.split(section, 1)[1].split("\n## ", 1)[0]
    return body, [Block(kind, b.splitlines()) for kind, b in re.findall(r"^```(\w+)\n(.*?)^```$", body,
                                                                          flags=re.S | re.M)]


def local(lines: list[str]) -> list[str]:
    """The absolute directory the reader ran in, wherever it is."""
    return [re.sub(rf"\S*/{DEV_DIR}/", f"DIR/{DEV_DIR}/", line) for line in lines]


def clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone's root, holding a link to the running venv, and an environment whose PATH leaves that venv out: the
    page's ``source .venv/bin/activate`` is what puts ``globald`` on it."""
    cwd = tmp_path / "clone"
    cwd.mkdir()
    (cwd / ".venv").symlink_to(VENV)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and Path(p).resolve() != (VENV / "bin").resolve())
    return cwd, env


def settled(cwd: Path, env: dict[str, str], command: str, expected: list[str],
            local: Callable[[list[str]], list[str]]) -> tuple[subprocess.CompletedProcess[str], bool]:
    """``command``'s last run, and whether it exited 0 with the page's output (both through ``local``): asked
    again for up to ``SETTLE_S`` while it does not, as a reader looks again a moment later."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        r = shell(cwd, env, command, timeout=300)
        done = r.returncode == 0 and same(local(expected), local(r.stdout.splitlines()))
        if done or time.monotonic() > deadline:
            return r, done
        time.sleep(0.5)


@pytest.mark.long  # a broker and a daemon, three reloads (each a check-config in a child process): over 30 s
def test_the_reload_walkthrough_runs_as_written(tmp_path: Path) -> None:
    prose, blocks = walkthrough()
    cwd, env = clone(tmp_path)
    terminals: dict[str, Terminal] = {}
    ran: list[str] = []
    try:
        for block in blocks:
            if block.kind == "text":  # more of the daemon's log
                terminals["run"].wait_for(lambda lines, b=block: in_order(local(b.lines), local(lines)), "err",
                                          "the daemon's log lines the page shows", timeout=SETTLE_S)
                continue
            for cmd in commands(block) if block.kind == "console" else []:
                ran.append(cmd.command)
                if cmd.command.startswith(("globald dev ", "globald run ")):
                    name, stream = ("dev", "out") if cmd.command.startswith("globald dev") else ("run", "err")
                    t = terminals[name] = Terminal(cwd, env, cmd.command, name)
                    t.wait_for(lambda lines, c=cmd, n=name: (any(READY_LINE in line for line in lines) and
                                                             same(c.expected, lines)) if n == "dev" else
                               in_order(c.expected, lines), stream, cmd.command, timeout=180)
                    continue
                r, done = settled(cwd, env, cmd.command, cmd.expected, local)
                log = "\n".join(terminals["run"].lines("err")[-20:])
                assert done, f"{cmd.command}: exit {r.returncode}\n{r.stdout}{r.stderr}\nthe daemon's log:\n{log}"
        assert terminals["run"].ctrl_c() == 0
        assert terminals["dev"].ctrl_c() == 0
        removed = f"globald dev: stopped; {DEV_DIR} removed"
        assert f"`{removed}`" in prose and terminals["dev"].lines()[-1] == removed
    finally:
        for t in reversed(list(terminals.values())):
            t.stop()
    assert any(c.startswith("kill -HUP") for c in ran) and f"globald reload --config {DEV_DIR}/globald.toml" in ran
