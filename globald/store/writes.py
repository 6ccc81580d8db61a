"""The one way to write a store: a write either lands whole or raises, and never waits on RocksDB for longer than
``WRITE_STALL_PATIENCE_S``; what it raises is mapped by ``failures``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rocksdict import Rdict, WriteBatch, WriteOptions

from globald.common.errors import StoreIOError
from globald.common.waits import pause
from globald.store.failures import classify, store_io
from globald.store.stalls import STALLS

log = logging.getLogger(__name__)

# RocksDB's answer to a write made with ``no_slowdown`` that it would otherwise hold back.
WRITE_STALL = "Write stall"
# How long a write may wait for RocksDB to make room (flushes and compactions catching up) before it counts as a
# store fault. A healthy disk clears a stall in well under a second; a full disk clears it only once space returns.
WRITE_STALL_PATIENCE_S = 30.0
_STALL_SLEEP_S = (0.001, 0.01)  # first and longest sleep between looks at RocksDB's write controller
_STALL_REPORTED_S = 1.0
_HELD_BACK = ("rocksdb.is-write-stopped", "rocksdb.actual-delayed-write-rate")


def write_options(disable_wal: bool = False, sync: bool = False) -> WriteOptions:
    """Options for ``write``: ``no_slowdown`` always, so that a stall comes back as an error instead of a wait."""
    o = WriteOptions()
    # Properties at run time; rocksdict's type stub declares them as methods.
    opts: Any = o
    opts.disable_wal = disable_wal
    opts.sync = sync
    opts.no_slowdown = True
    return o


def write(db: Rdict, batch: WriteBatch, opts: WriteOptions, context: str,
          rebuild: Callable[[], WriteBatch] | None = None, patience: float = WRITE_STALL_PATIENCE_S) -> None:
    """Write ``batch`` atomically with ``opts`` (from ``write_options``), waiting out write stalls here.

    RocksDB holds a write back while its flushes or compactions are behind, and rocksdict waits for it with the
    GIL held: on a full disk every thread of the daemon (HTTP, status file, signal handling) froze until space
    returned. Here the wait is a Python sleep: before writing while RocksDB's write controller says it holds
    writes back, and after a write it refused all the same (the controller can change its mind inside the
    write). rocksdict consumes a batch even when RocksDB refuses it, so a refused write is made again from
    ``rebuild()``; without one it fails. Raises StoreIOError once a stall outlasts ``patience`` (the loop treats
    it as any store fault), or the classified error of any other failure. A write that raised left nothing.
    """
    held_since: float | None = None
    while True:
        if _held_back(db, context):
            held_since = held_since or time.monotonic()
            _wait_for_room(db, held_since, patience, context)
        try:
            db.write(batch, opts)
        except Exception as e:
            if WRITE_STALL not in str(e):
                raise classify(e, context) from e
            if rebuild is None:
                raise StoreIOError(f"{context}: RocksDB held the write back (flushes behind) and it cannot be made "
                                   "again") from e
            held_since = held_since or time.monotonic()
            STALLS.remade += 1
            _wait_for_room(db, held_since, patience, context, at_least_once=True)
            batch = rebuild()
            continue
        if held_since is not None:
            waited = time.monotonic() - held_since
            STALLS.waited += 1
            STALLS.seconds += waited
            if waited >= _STALL_REPORTED_S:
                log.info("%s: waited %.1fs for RocksDB to catch up with flushes and compactions", context, waited)
        return


def _held_back(db: Rdict, context: str) -> bool:
    with store_io(context):
        return any(db.property_int_value(name) for name in _HELD_BACK)


def _wait_for_room(db: Rdict, held_since: float, patience: float, context: str, at_least_once: bool = False) -> None:
    """Sleep until RocksDB's write controller neither stops nor delays writes (once at least, if asked)."""
    sleep = _STALL_SLEEP_S[0]
    while at_least_once or _held_back(db, context):
        at_least_once = False
        waited = time.monotonic() - held_since
        if waited >= patience:
            raise StoreIOError(f"{context}: RocksDB held writes back for {waited:.0f}s (flushes or compactions not "
                               "catching up: is the disk full or failing?)")
        pause(sleep)
        sleep = min(sleep * 2, _STALL_SLEEP_S[1])
