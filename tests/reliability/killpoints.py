"""The real daemon with one armed kill point: ``python -m tests.reliability.killpoints run --config FILE``.

``GLOBALD_KILL_AT=POINT:N`` makes the process SIGKILL itself the N-th time it reaches POINT, after printing
``KILLPOINT POINT:N`` to stderr so the test can tell a planned death from a crash. Everything else is globald's own
CLI, unchanged: the wrapper only wraps functions at the moments a crash is most dangerous (between a write and
its commit, halfway through a wipe, between a snapshot's files and its publication).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from globald.cli import main as cli
from globald.store.names import CHECKPOINT_FILE, STATUS_FILE
from globald.store.table_store import TableStore

ENV = "GLOBALD_KILL_AT"
MARKER = "KILLPOINT"
SNAPSHOTS_DIR = "snapshots"  # <state_dir>/snapshots/<table>/<id>/, as specified by the snapshots issue

# Points whose meaning does not depend on the snapshot module existing.
CORE_POINTS = ("write-before", "write-after", "commit-synced", "checkpoint-file-replace", "status-replace",
               "wipe-unlink", "wipe-deleted")
SNAPSHOT_POINTS = ("snapshot-checkpointed", "snapshot-publish-before", "snapshot-publish-after")
POINTS = CORE_POINTS + SNAPSHOT_POINTS


class _Trigger:
    def __init__(self, point: str, nth: int) -> None:
        self.point, self.nth, self.seen = point, nth, 0

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.seen += 1
        if self.seen >= self.nth:
            die(f"{point}:{self.nth}")


def die(spec: str) -> None:
    sys.stderr.write(f"{MARKER} {spec}\n")
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _around(owner: Any, name: str, before: Callable[..., None] | None = None,
            after: Callable[..., None] | None = None) -> None:
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(*args, **kwargs)
        result = original(*args, **kwargs)
        if after is not None:
            after(*args, **kwargs)
        return result

    setattr(owner, name, wrapped)


def _in_snapshots(dst: Any) -> bool:
    return f"/{SNAPSHOTS_DIR}/" in os.fspath(dst)


def arm(spec: str) -> None:
    point, _, n = spec.partition(":")
    if point not in POINTS:
        raise SystemExit(f"{ENV}: unknown kill point {point!r} (known: {', '.join(POINTS)})")
    t = _Trigger(point, int(n or 1))
    _around(TableStore, "write", before=lambda *a, **k: t.reached("write-before"),
            after=lambda *a, **k: t.reached("write-after"))
    # StateManager.commit syncs every dirty store first, then writes each .checkpoint file.
    _around(TableStore, "write_checkpoint_file", before=lambda *a, **k: t.reached("commit-synced"))
    _around(TableStore, "checkpoint", after=lambda *a, **k: t.reached("snapshot-checkpointed"))

    def on_replace(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        name = Path(os.fspath(dst)).name
        if name == CHECKPOINT_FILE:
            t.reached("checkpoint-file-replace")
        elif name == STATUS_FILE:
            t.reached("status-replace")
        elif _in_snapshots(dst):
            t.reached("snapshot-publish-before")

    def after_replace(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        if _in_snapshots(dst):
            t.reached("snapshot-publish-after")

    for fn in ("replace", "rename"):
        _around(os, fn, before=on_replace, after=after_replace)

    # A wipe that dies halfway leaves whatever shutil.rmtree had not reached yet: count its unlinks.
    wiping = [False]
    original_delete = TableStore._delete_files

    def delete_files(self: TableStore) -> None:
        wiping[0] = True
        try:
            original_delete(self)
        finally:
            wiping[0] = False
        if t.point == "wipe-unlink":  # fewer files than N: die once the wipe is done
            die(f"wipe-unlink:{t.nth} (after {t.seen} unlinks)")

    TableStore._delete_files = delete_files  # type: ignore[method-assign]
    _around(TableStore, "_delete_files", after=lambda *a, **k: t.reached("wipe-deleted"))
    _around(os, "unlink", after=lambda *a, **k: wiping[0] and t.reached("wipe-unlink"))


def main() -> int:
    spec = os.environ.get(ENV)
    if spec:
        arm(spec)
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
