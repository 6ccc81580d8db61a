"""``globald reload --config F``: ask the daemon running on F's state_dir to read F again (``service.reload``).

The request is a file in the state_dir's ``requests/`` (``ops.operator_requests``), so only a user who may write
the state_dir may ask. It names F as given (absolute, symlinks not resolved: the daemon opens the path again, and
follows a ConfigMap's symlink swap). Exit 0 once the new config is in force; 2 when it is refused (the daemon's one
line: the key that cannot change live, or check-config's line), the old config still running; 5 when no daemon
could be asked.

The daemon is found by F's ``state_dir``, read even from a file that does not pass the check (so that the refusal
reaches the daemon's log and status too); ``--state-dir`` names it instead, for a file that changes ``state_dir``
(refused) or that is not TOML at all.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from pathlib import Path

from globald.common import exitcodes
from globald.common.errors import ConfigError
from globald.settings import config as configmod


def add_reload_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", metavar="DIR", help="the running daemon's state_dir (default: the file's own "
                   "state_dir); needed when the file changes state_dir (refused) or is not TOML")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait for the daemon's answer (default 600: it runs check-config, which may "
                        "reach a registry)")


def _state_dir(path: Path) -> Path:
    """F's state_dir, as the daemon would take it, even when F fails the check on another key."""
    try:
        return configmod.load(path).state_dir
    except ConfigError as e:
        error = e
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8")).get("state_dir")
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        raw = None
    if not isinstance(raw, str) or not raw:
        raise ConfigError(error.key, str(error).removeprefix(f"{error.key}: ") + " (the daemon was not asked: "
                          "pass --state-dir to have it refuse this file itself)") from None
    state_dir = Path(raw)
    return state_dir if state_dir.is_absolute() else path.resolve().parent / state_dir


def cmd_reload(args: argparse.Namespace) -> int:
    from globald.cli.running import running_daemon
    from globald.common.requests import RELOAD
    from globald.ops.operator_requests import ask_daemon

    path = Path(os.path.abspath(args.config))
    state_dir = Path(os.path.abspath(args.state_dir)) if args.state_dir else _state_dir(path)
    running_daemon(state_dir, None if args.state_dir else args.config,
                   "" if args.state_dir else "a daemon running on another one cannot change state_dir live: pass "
                   "--state-dir to ask it anyway")
    answer = ask_daemon(state_dir, RELOAD, timeout=args.timeout, config=str(path))
    if args.json:
        print(json.dumps({k: answer.get(k) for k in ("ok", "error", "generation", "sha256", "pid")}, sort_keys=True))
    if not answer.get("ok"):
        if not args.json:
            print(f"globald: reload refused: {answer.get('error')}", file=sys.stderr)
        return exitcodes.USAGE
    if not args.json:
        print(f"{args.config}: applied, config generation {answer.get('generation')} (pid {answer.get('pid')})")
    return exitcodes.OK
