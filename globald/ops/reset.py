"""``globald reset``: wipe one table on purpose, so the daemon restores it from the log start.

The state_dir lock decides who wipes: when no daemon holds it, the CLI takes it and wipes the store itself (a
daemon cannot start meanwhile); when a daemon holds it, the wipe is asked of that daemon through the requests
directory and done on its loop, counted as an ``operator_reset`` wipe, and the command returns once the daemon
has wiped the store (or raises with the wipe's error). A store is never wiped behind a daemon.
"""

from __future__ import annotations

from dataclasses import dataclass

from globald.common.errors import GlobaldError, StateDirLockedError
from globald.common.requests import RESET
from globald.ops.operator_requests import ask_daemon
from globald.settings.config import Config
from globald.store.names import db_dir, table_dir
from globald.store.options import StoreOptions
from globald.store.statedir import lock_state_dir
from globald.store.table_store import TableStore


@dataclass(frozen=True)
class ResetResult:
    table: str
    by: str  # "daemon" or "offline"
    pid: int | None  # the daemon that did it
    had_store: bool

    def describe(self) -> str:
        if self.by == "daemon":
            return (f"table {self.table} wiped by the running daemon (pid {self.pid}); "
                    "it is restoring from the log start")
        if not self.had_store:
            return f"table {self.table} had no store; nothing to wipe"
        return f"table {self.table} wiped; the next `globald run` restores it from the log start"


def reset_table(config: Config, table: str, timeout: float = 30.0) -> ResetResult:
    name = config.table(table).name
    topic = config.table(table).topic
    if not config.state_dir.is_dir():
        return ResetResult(name, "offline", None, had_store=False)
    try:
        lock = lock_state_dir(config.state_dir)
    except StateDirLockedError:
        answer = ask_daemon(config.state_dir, RESET, timeout, table=name)
        if not answer.get("ok"):
            raise GlobaldError(f"the running daemon did not reset table {name}: {answer.get('error')}") from None
        pid = answer.get("pid")
        return ResetResult(name, "daemon", pid if isinstance(pid, int) else None, had_store=True)
    try:
        if not table_dir(config.state_dir, name).exists():
            return ResetResult(name, "offline", None, had_store=False)
        had_store = (db_dir(config.state_dir, name) / "CURRENT").exists()
        opened = TableStore.open(config.state_dir, name, topic, StoreOptions.from_config(config.store),
                                 origins=config.table(table).typed,
                                 history_ms=config.table(table).history)
        try:
            opened.store.wipe()
        finally:
            opened.store.close(clean=True)
        return ResetResult(name, "offline", None, had_store=had_store)
    finally:
        lock.close()
