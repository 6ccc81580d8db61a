"""Checks the reliability suite makes after every fault: stores and snapshots against the oracle fold, PIDs.

A store is compared at the offsets stored inside it, read in the same read-only open as its data, so the check
is exact whether the daemon runs, was stopped, or was SIGKILLed a moment ago. A check that could not compare
(no store, one that cannot be opened, offsets the log does not hold) fails with ``NotCompared``: "0 divergences"
must mean the store was read and equals the oracle. A caller for whom such a store is a legitimate outcome (a
kill in the middle of a wipe: nothing can read it, the daemon wipes it on start) says so with
``allow_uncompared=True``, and must then look at ``StoreCheck.compared`` itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globald.common.errors import StoreUnavailableError
from globald.embedded.oracle import Table, fold
from globald.store.names import db_dir
from globald.store.reader import StoreReader
from tests.harness import Broker, DaemonProcess


def diff(actual: Table, expected: Table) -> int:
    """Keys whose value differs, is missing or is extra."""
    return sum(1 for k in actual.keys() | expected.keys() if actual.get(k) != expected.get(k))


def explain(actual: Table, expected: Table, show: int = 3) -> str:
    """What a divergence consists of, for the failure message."""
    missing = [k for k in expected if k not in actual]
    extra = [k for k in actual if k not in expected]
    changed = [k for k in actual if k in expected and actual[k] != expected[k]]
    return (f"{len(missing)} missing (e.g. {missing[:show]}), {len(extra)} extra (e.g. {extra[:show]}), "
            f"{len(changed)} different (e.g. {[(k, actual[k][:20], expected[k][:20]) for k in changed[:show]]})")


@dataclass
class StoreCheck:
    readable: bool
    offsets: dict[int, int] = field(default_factory=dict)
    keys: int = 0
    divergences: int = 0
    error: str | None = None
    invalid_offsets: bool = False  # offsets the log does not have: the daemon must wipe this store on start

    @property
    def compared(self) -> bool:
        """The store was read and compared with the oracle: only then does ``divergences`` mean anything."""
        return self.readable and not self.invalid_offsets


class NotCompared(AssertionError):
    """A store check that compared nothing: it must not pass as 0 divergences."""


def read_store(path: Path) -> tuple[dict[int, int], Table]:
    """Offsets and values of the database at ``path``, from one read-only open."""
    with StoreReader(path) as r:
        return r.offsets(), {k: v for k, v, _ in r.items()}


def live(d: DaemonProcess, table: str) -> Table:
    """The values in a table's live store now (``globald dump`` may serve a snapshot, which lags behind)."""
    return read_store(db_dir(d.state_dir, table))[1]


def check_store(broker: Broker, state_dir: Path, table: str, topic: str, *,
                allow_uncompared: bool = False) -> StoreCheck:
    """The store of ``table`` against the oracle fold of ``topic`` at the offsets stored in it.

    Raises ``NotCompared`` when the store is missing, unreadable or at offsets outside the log, unless
    ``allow_uncompared`` (the result then says which, and ``compared`` is False)."""
    check = _check_store(broker, state_dir, table, topic)
    if not check.compared and not allow_uncompared:
        raise NotCompared(f"store of {table} not compared with the oracle: {check.error}; {check}")
    return check


def _check_store(broker: Broker, state_dir: Path, table: str, topic: str) -> StoreCheck:
    path = db_dir(state_dir, table)
    if not (path / "CURRENT").exists():
        return StoreCheck(readable=False, error="no store on disk")
    try:
        offsets, data = read_store(path)
    except StoreUnavailableError as e:
        return StoreCheck(readable=False, error=str(e))
    except Exception as e:  # RocksDB reports corruption found while iterating as a plain Exception
        return StoreCheck(readable=False, error=f"read failed: {e}")
    marks = broker.admin.watermarks(topic)
    if any(p not in marks or not marks[p][0] <= o <= marks[p][1] for p, o in offsets.items()):
        return StoreCheck(readable=True, offsets=offsets, keys=len(data), invalid_offsets=True,
                          error=f"offsets {offsets} outside the log {marks}")
    expected = fold(broker.settings, topic, offsets)
    n = diff(data, expected)
    return StoreCheck(readable=True, offsets=offsets, keys=len(data), divergences=n,
                      error=explain(data, expected) if n else None)


# -- snapshots (the layout of the snapshots issue: <state_dir>/snapshots/<table>/<id>/ with a JSON manifest) -----

MANIFEST_NAMES = ("manifest.json", "MANIFEST.json", "snapshot.json")


@dataclass
class SnapshotCheck:
    path: Path
    visible: bool  # a reader would find it: not a dot-name (work in progress) and a manifest that parses
    divergences: int = 0
    error: str | None = None


def _manifest_offsets(doc: dict[str, Any]) -> dict[int, int]:
    raw = doc.get("offsets")
    if not isinstance(raw, dict):
        raise ValueError(f"manifest has no offsets map: {sorted(doc)}")
    return {int(p): int(o) for p, o in raw.items()}


def _db_of(snapshot: Path) -> Path:
    return snapshot / "db" if (snapshot / "db" / "CURRENT").exists() else snapshot


def check_snapshots(broker: Broker, state_dir: Path, table: str, topic: str) -> list[SnapshotCheck]:
    """Every snapshot directory of ``table``: invisible (no manifest), or complete and equal to the oracle.

    A visible snapshot that cannot be opened or disagrees with the oracle at its manifest offsets counts as one
    divergence per differing key (at least one when it cannot be read at all). One marked stale, or at offsets
    the log no longer holds, shows an older topic (recreated, or cut by retention): it is listed unverified.
    """
    marks = broker.admin.watermarks(topic)
    root = state_dir / "snapshots" / table
    out: list[SnapshotCheck] = []
    if not root.is_dir():
        return out
    for snap in sorted(p for p in root.iterdir() if p.is_dir()):
        if snap.name.startswith("."):
            out.append(SnapshotCheck(snap, visible=False))
            continue
        manifest = next((snap / n for n in MANIFEST_NAMES if (snap / n).is_file()), None)
        if manifest is None:
            out.append(SnapshotCheck(snap, visible=False))
            continue
        try:
            doc = json.loads(manifest.read_text())
            offsets = _manifest_offsets(doc)
        except (OSError, ValueError) as e:
            out.append(SnapshotCheck(snap, visible=False, error=f"manifest does not parse: {e}"))
            continue
        if doc.get("stale") or any(p not in marks or not marks[p][0] <= o <= marks[p][1] for p, o in offsets.items()):
            out.append(SnapshotCheck(snap, visible=True, error="unverifiable: stale, or offsets outside the log"))
            continue
        try:
            _, data = read_store(_db_of(snap))
        except Exception as e:
            out.append(SnapshotCheck(snap, visible=True, divergences=1, error=f"visible but unreadable: {e}"))
            continue
        out.append(SnapshotCheck(snap, visible=True, divergences=diff(data, fold(broker.settings, topic, offsets))))
    return out


def snapshots_available() -> bool:
    try:
        import globald.snapshot  # noqa: F401
    except ImportError:
        return False
    return True


# -- the daemon process ---------------------------------------------------------------------------------------


def same_process(d: DaemonProcess, pid: int) -> int:
    """0 when the daemon started as ``pid`` still runs and still publishes status as ``pid``, else 1."""
    if not d.alive() or d.pid != pid:
        return 1
    return 0 if d.status().get("pid") == pid else 1


def watch(d: DaemonProcess, seconds: float, every: float = 0.5,
          check: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Status documents over ``seconds``; fails as soon as the daemon exits. ``check`` sees each document."""
    docs: list[dict[str, Any]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not d.alive():
            raise AssertionError(f"daemon exited during the fault; log:\n{d.tail()}")
        doc = d.status()
        docs.append(doc)
        if check is not None:
            check(doc)
        time.sleep(every)
    return docs
