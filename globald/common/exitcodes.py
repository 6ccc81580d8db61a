"""The exit codes of every ``globald`` command: one table, so a script can branch on them the same way everywhere.

The "Exit codes" table of docs/reference/cli.md is this one; ``tests/unit/test_newcomer_commands.py`` holds every
command to it. A code says what kind of outcome it was, never which command produced it.
"""

from __future__ import annotations

OK = 0
# What was asked for does not exist: get's key, a table with no store or snapshot yet, a snapshot id. Distinct
# from FAILED so that "absent" never looks like "broken".
NOT_FOUND = 1
# The command line or the config is wrong (a bad key, an unknown table, a malformed KEY, a state_dir this user
# cannot use): one line naming it, nothing touched. argparse uses 2 for its own usage errors too.
USAGE = 2
# Nothing consistent can be served right now (a rebuild with serve_stale off, nothing published yet), or the daemon
# is starting and has published no status yet: ask again.
UNAVAILABLE = 3
# Refused to act, on purpose: another globald owns the state_dir, a wipe was not confirmed, an import would lose
# data. Nothing was changed.
REFUSED = 4
# The command started and failed: Kafka, the disk or a store failed, a dump stopped partway; or the command needs
# the running daemon (status, reload, export) and none holds the config's state_dir.
FAILED = 5
# Interrupted by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130

TABLE: tuple[tuple[int, str, str], ...] = (
    (OK, "success", "the command did what was asked"),
    (NOT_FOUND, "not found", "get: the key is absent; snapshots: the table has no store or no snapshot yet"),
    (USAGE, "usage or config error", "a bad argument, config key, table name or KEY, or a state_dir this user "
     "cannot use; one line names it, nothing was touched; reload: the running daemon refused the file, the config "
     "in force still runs"),
    (UNAVAILABLE, "unavailable now", "get/dump: no consistent version of the table can be served now; status: the "
     "daemon holding the state_dir is starting and has published no status yet; ask again"),
    (REFUSED, "refused", "another globald owns the state_dir, a wipe was not confirmed, an import would lose data"),
    (FAILED, "runtime failure", "Kafka, the disk or a store failed, or a dump stopped partway; status, reload, "
     "export: no globald runs on the config's state_dir; the line says what"),
    (INTERRUPTED, "interrupted", "Ctrl-C"),
)


def epilog() -> str:
    """The table as ``globald --help`` shows it."""
    return "exit codes:\n" + "\n".join(f"  {code:<4} {name}" for code, name, _ in TABLE)
