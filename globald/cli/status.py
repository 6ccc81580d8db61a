"""``globald status --config F``: what the daemon running on F's state_dir publishes, and whether one runs at all.

Exit 0 with the running daemon's status. Exit 3 (unavailable now) when a process holds the state_dir's lock but
has published no status yet: a daemon starting (bootstrapping from an export, waiting for the registry). Exit 5
when no process holds it (``cli.running``, the line reload and export say too): the stores' committed offsets are
still shown, read from disk, and the one line on stderr names the state_dir looked in, so that a config naming
another state_dir than the running daemon's is not read as "stopped".
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from globald.common import exitcodes
from globald.settings import config as configmod


@dataclass(frozen=True)
class Answer:
    """What ``globald status`` says: its exit code, the document ``--json`` prints, the plain form's lines, and the
    one line for stderr (no daemon, or one starting). The test harness waits on daemons through ``answer`` in its
    own process: a process per read cost ~0.5 s of CPU, starving the daemon waited for on a 2-core machine."""

    code: int
    doc: dict[str, Any]
    lines: list[str]
    note: str | None = None


def starting_line(state_dir: Path, holder: str) -> str:
    return (f"globald (pid {holder}) is starting on state_dir {state_dir}: it holds the state_dir's lock and has "
            "published no status yet; ask again in a moment")


def answer(cfg: configmod.Config, config_path: str | None) -> Answer:
    from globald.cli.running import NoDaemonError, running_daemon
    from globald.common.states import State
    from globald.status import statusfile

    live = statusfile.read_live(cfg.state_dir)
    if live is not None:
        return Answer(exitcodes.OK, live.to_json(), statusfile.status_lines(live))
    try:
        holder = running_daemon(cfg.state_dir, config_path)
    except NoDaemonError as e:
        offline = statusfile.offline(cfg)  # what the stores on disk say, as before
        return Answer(exitcodes.FAILED, offline.to_json(), statusfile.status_lines(offline), f"globald: {e}")
    # Its stores are the daemon's now (a bootstrap may be writing them): not opened here.
    line = starting_line(cfg.state_dir, holder)
    doc: dict[str, Any] = {"state": State.CREATED.value, "pid": int(holder) if holder.isdigit() else None,
                           "tables": {}, "reason": line}
    return Answer(exitcodes.UNAVAILABLE, doc, [f"globald: {State.CREATED.value} (pid {holder}), starting"],
                  f"globald: {line}")


def cmd_status(args: argparse.Namespace) -> int:
    a = answer(configmod.load(args.config), args.config)
    print(json.dumps(a.doc, indent=None, sort_keys=True) if args.json else "\n".join(a.lines))
    if a.note is not None:
        print(a.note, file=sys.stderr)
    return a.code
