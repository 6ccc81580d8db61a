"""``python -m globald.typed.decode_snapshot``: decode a typed table's CURRENT snapshot into its columnar file.

The daemon runs this as a separate process (``globald.ops.decoding``), never in one of its threads: decoding is
Python per value (fastavro, protobuf and orjson hold the GIL, ~40 us a value), and a thread of the daemon would take
that time from the loop that ingests. This process makes itself as unimportant to the scheduler as it can while
still always progressing (nice 19 and SCHED_BATCH), so ingestion, commits and the Spark workers run first.

It opens CURRENT as it finds it at its start, pinned with a lease (renewed by a thread while it runs, released at
the end), so retention cannot delete the snapshot under it; then ``ensure_columnar`` does what the first Spark
worker would (the same file, the same host lock; the decoding itself outside the lock, see ``_columnar``): a
file already written is only mapped. SIGTERM (the daemon
stopping) ends it cleanly: at once while the snapshot is open (the temporary file is removed, the lease released, no
columnar file appears), else at the next safe point (``_Termination``). If the daemon dies, the kernel sends it
SIGTERM too (PR_SET_PDEATHSIG).

Its stdout is for the daemon: one JSON line when the snapshot is open (``{"event": "open", "snapshot": id}``) and
one when done (``{"event": "done", ...}``: the snapshot, its offsets, the file's rows and decode errors). Its log
goes to stderr, which it shares with the daemon. Exit 0 when done (a snapshot too large for one file included:
``"too_large": true``), 1 on a failure the log explains, 143 on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger("globald.typed.decode_snapshot")

_PR_SET_PDEATHSIG = 1
LOCK_POLL_S = 0.1


def lower_priority() -> None:
    """Nice 19 (about 1.5 % of a core against one normal process wanting it) and SCHED_BATCH (never preempts
    another on waking). Not SCHED_IDLE, lower still: an unprivileged process cannot leave it, and one that gets no
    CPU while it holds the host lock would make the readers waiting for that lock wait on it. Best effort: a
    kernel or container refusing one leaves the other."""
    with contextlib.suppress(OSError):
        os.nice(19 - os.nice(0))
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH"):
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


def die_with(parent: int) -> None:
    """SIGTERM when the daemon dies (Linux); exit now if it already has (it died before the call)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(143)


class _Termination:
    """SIGTERM, acted on only where unwinding is safe. While the snapshot is open, the handler raises SystemExit at
    once: it unwinds through replace_file (which removes its temporary file), the host lock and the snapshot's
    context manager (which releases the lease). Before that (imports, RocksDB opening the snapshot: an exit in the
    middle of those could leave the lease taken, or a half-made database handle to finalize) it is only noted,
    and honoured at the next ``checkpoint``. An exception raised by a signal handler can also be lost (seen: one
    raised while an import compiled a module), so the request is checked again at safe points: every value read
    for decoding, every poll of the host lock, before the write."""

    def __init__(self) -> None:
        self.requested = False
        self.interruptible = False

    def handler(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        if self.interruptible:
            raise SystemExit(143)

    def checkpoint(self, interruptible: bool | None = None) -> None:
        if interruptible is not None:
            self.interruptible = interruptible
        if self.requested:
            raise SystemExit(143)

    def checked(self, items: Iterator[tuple[bytes, bytes, int]]) -> Iterator[tuple[bytes, bytes, int]]:
        for item in items:
            if self.requested:
                raise SystemExit(143)
            yield item


TERM = _Termination()


def _emit(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc) + "\n")
    sys.stdout.flush()


def _keep_leased(snap: Any, every_s: float, done: threading.Event) -> threading.Thread:
    """Renew the snapshot's lease while the decode runs (``Snapshot.renew`` rewrites it once half has run out)."""

    def run() -> None:
        while not done.wait(every_s):
            try:
                snap.renew()
            except OSError as e:  # a full disk: the lease written at the start still holds for its ttl
                log.warning("cannot renew the lease on snapshot %s: %s", snap.id, e)

    thread = threading.Thread(target=run, name="lease-renewal", daemon=True)
    thread.start()
    return thread


def decode(config_path: str, table: str, holder: str, lease_s: float, sha256: str | None = None) -> dict[str, Any]:
    """Open CURRENT of ``table`` under a lease, make sure its columnar file exists, and say what it holds.
    ``sha256``: the config file's bytes in force in the daemon; a file whose bytes differ is not decoded with."""
    from globald.common import logs
    from globald.snapshot.reader import OpenOptions, Snapshot
    from globald.typed import load_table
    from globald.typed.columnar import build_table  # noqa: F401 - imported here, before the snapshot is open

    config = _config_in_force(config_path, sha256)
    logs.setup(config.log_level, config.log_format)
    # First: a schema that does not load touches no snapshot. Both decoders, as the Spark side loads them: a typed
    # key gives the file another index and another name (globald.typed.keys.fingerprint).
    key_decoder, decoder = load_table(config, table)
    TERM.checkpoint(interruptible=False)
    with Snapshot(config.state_dir, table, None, OpenOptions(serve_stale=True, lease_s=lease_s, holder=holder)) \
            as snap:
        TERM.checkpoint(interruptible=True)
        _emit({"event": "open", "snapshot": snap.id, "dir": str(snap.table_dir / snap.id)})
        done = threading.Event()
        renewer = _keep_leased(snap, lease_s / 4, done)
        try:
            about: dict[str, Any] = {"event": "done", "snapshot": snap.id, "created": snap.manifest.created,
                                     "offsets": {str(p): o for p, o in snap.offsets.items()}}
            return {**about, **_columnar(snap, decoder, key_decoder, table)}
        finally:
            done.set()
            renewer.join()


def _config_in_force(path: str, sha256: str | None) -> Any:
    """The config at ``path``, read once: its bytes must be those in force in the daemon (``sha256``), so that a
    file edited since the last reload, or one a reload refused, is never decoded with."""
    import hashlib
    import tomllib

    from globald.common.errors import ConfigError
    from globald.settings.config import load, parse

    if sha256 is None:
        return load(path)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError("--config", f"cannot read {path}: {e.strerror or e}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ConfigError("--config", f"{path} is not the config in force (it changed since the daemon loaded it): "
                          "not decoding with it; reload it (globald reload) or put the file back")
    try:
        return parse(tomllib.loads(data.decode("utf-8")), Path(path).resolve())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:  # bytes in force were checked: only a bug gets here
        raise ConfigError("--config", f"{path} cannot be read as TOML: {e}") from None


def _columnar(snap: Any, decoder: Any, key_decoder: Any, table: str) -> dict[str, Any]:
    """What ``ensure_columnar`` does, with the decoding outside the host lock: a reader arriving meanwhile takes the
    lock and decodes for itself, never waiting behind this process, which gets little CPU on a busy host (nice 19:
    a priority inversion). Only the write, which decodes nothing, is made under the lock; a file a reader wrote
    meanwhile is kept and ours dropped."""
    from globald.typed.columnar import (
        ColumnarInvalid,
        ColumnarTable,
        ColumnarTooLarge,
        build_table,
        columnar_path,
        write_columnar,
    )
    from globald.typed.keys import fingerprint

    directory = snap.table_dir / snap.id
    path, fp = columnar_path(directory, decoder, key_decoder), fingerprint(decoder, key_decoder)
    with contextlib.suppress(FileNotFoundError, ColumnarInvalid):
        found = ColumnarTable.open(path, fp, decoder.available)  # redone when a pending writer id can be had
        return _figures(found, path, written=False)
    about = {"table": snap.manifest.table, "snapshot": snap.id,
             "offsets": {str(p): o for p, o in snap.offsets.items()}}
    try:
        built = build_table(TERM.checked(iter(snap)), decoder, about, key_decoder, snap.origins)
    except ColumnarTooLarge as e:
        log.info("table %s: snapshot %s is too large for a columnar file (%s); readers decode per batch", table,
                 snap.id, e)
        return {"too_large": True}
    with host_lock(directory):
        with contextlib.suppress(FileNotFoundError, ColumnarInvalid):
            found = ColumnarTable.open(path, fp, decoder.available)
            return _figures(found, path, written=False)  # a reader wrote it meanwhile
        TERM.checkpoint()
        write_columnar(path, built)
    written = ColumnarTable.open(path, fp)
    log.info("decoded snapshot %s of %s into %s: %d rows, %d decode errors, %.2fs", snap.id, table, path.name,
             len(written), written.error_count, written.meta.get("decode_s", 0.0))
    return _figures(written, path, written=True)


@contextlib.contextmanager
def host_lock(directory: Path) -> Iterator[None]:
    """The lock ensure_columnar writes under (an flock of the snapshot directory), taken by polling: a SIGTERM that
    lands just before a blocking flock() would not interrupt it (Python runs handlers between bytecodes), and the
    process would wait for a reader's whole decode before it stops."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                TERM.checkpoint()
                time.sleep(LOCK_POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock


def _figures(columnar: Any, path: Any, written: bool) -> dict[str, Any]:
    first = columnar.errors.drop_null()[0].as_py() if columnar.error_count else None  # one reason, for the log
    return {"file": path.name, "values": len(columnar), "errors": columnar.error_count, "first_error": first,
            "key_errors": columnar.meta.get("key_errors", 0), "decode_seconds": columnar.meta.get("decode_s"),
            "written": written, "pending": columnar.pending}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m globald.typed.decode_snapshot", description=__doc__)
    parser.add_argument("--config", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--holder", required=True, help="the lease holder name")
    parser.add_argument("--lease-s", type=float, default=60.0)
    parser.add_argument("--parent", type=int, default=0, help="the daemon's pid: this process ends with it")
    parser.add_argument("--sha256", default=None, help="the config file's bytes in force in the daemon")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, TERM.handler)
    lower_priority()
    if args.parent:
        die_with(args.parent)
    started = time.monotonic()
    try:
        doc = decode(args.config, args.table, args.holder, args.lease_s, args.sha256)
    except Exception as e:  # the daemon counts the failure; this says why, in the daemon's log
        from globald.common.swallowed import EXPECTED

        # An expected error (a disk, a schema file, a snapshot gone) is one line; anything else is a defect.
        log.error("table %s: decoding the current snapshot failed: %s: %s", args.table, type(e).__name__, e,
                  exc_info=not isinstance(e, EXPECTED))
        return 1
    _emit({**doc, "seconds": round(time.monotonic() - started, 3)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
