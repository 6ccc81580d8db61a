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
from pathlib import Path

from globald.common import exitcodes
from globald.ops.status import DaemonStatus
from globald.settings import config as configmod


def _print(doc: DaemonStatus, as_json: bool) -> None:
    from globald.ops import statusfile

    if as_json:
        print(json.dumps(doc.to_json(), indent=None, sort_keys=True))
    else:
        print("\n".join(statusfile.status_lines(doc)))


def starting_line(state_dir: Path, holder: str) -> str:
    return (f"globald (pid {holder}) is starting on state_dir {state_dir}: it holds the state_dir's lock and has "
            "published no status yet; ask again in a moment")


def cmd_status(args: argparse.Namespace) -> int:
    from globald.cli.running import NoDaemonError, running_daemon
    from globald.common.states import State
    from globald.ops import statusfile

    cfg = configmod.load(args.config)
    live = statusfile.read_live(cfg.state_dir)
    if live is not None:
        _print(live, args.json)
        return exitcodes.OK
    try:
        holder = running_daemon(cfg.state_dir, args.config)
    except NoDaemonError as e:
        _print(statusfile.offline(cfg), args.json)  # what the stores on disk say, as before
        print(f"globald: {e}", file=sys.stderr)
        return exitcodes.FAILED
    # Its stores are the daemon's now (a bootstrap may be writing them): not opened here.
    line = starting_line(cfg.state_dir, holder)
    if args.json:
        doc: dict[str, object] = {"state": State.CREATED.value, "pid": int(holder) if holder.isdigit() else None,
                                  "tables": {}, "reason": line}
        print(json.dumps(doc, sort_keys=True))
    else:
        print(f"globald: {State.CREATED.value} (pid {holder}), starting")
    print(f"globald: {line}", file=sys.stderr)
    return exitcodes.UNAVAILABLE
