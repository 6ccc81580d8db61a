"""The campaign's checks (a part of ``campaign.SeedRun``): every store and snapshot against the oracle fold at its own
offsets, no ``.checkpoint`` or manifest claiming more than its database holds, and what readers rely on: a leased
snapshot stays, CURRENT opens."""

from __future__ import annotations

import contextlib
from pathlib import Path

from globald.common.errors import ManifestError
from globald.snapshot import leases
from globald.snapshot import manifest as manifests
from globald.snapshot.reader import current_id
from globald.store import checkpoint_file
from globald.store.names import checkpoint_path, snapshots_dir
from globald.store.reader import StoreReader
from tests.chaos.base import SeedBase
from tests.chaos.outcome import (
    READER,
    READER_LEASE_S,
    Outcome,
)
from tests.chaos.plan import Fault
from tests.reliability.checks import check_snapshots, check_store


class Checks(SeedBase):
    """What a fault must leave true: ``verify``, ``lease_current`` and ``check_readers``."""

    def verify(self, out: Outcome, online: bool) -> None:
        """Every store and snapshot against the oracle at its own offsets; claims of .checkpoint and manifests."""
        when = "while RUNNING" if online else "left by the stopped daemon"
        for table, topic in self.topics.items():
            marks = self.admin.watermarks(topic)
            claimed, bad = self._checkpoint_claims(table, topic)  # read before the store: a commit in between
            if bad:  # can only move the store further ahead than the file
                out.divergences += 1
                out.problems.append(f"{table}: .checkpoint does not parse ({when}): {bad}")
            store = check_store(self.broker, self.daemon.state_dir, table, topic, allow_uncompared=True)
            out.checks += 1
            if not store.readable:
                if online:
                    out.divergences += 1
                    out.problems.append(f"{table}: store unreadable {when}: {store.error}")
                else:
                    out.notes.append(f"{table}: store unreadable {when}: {store.error}")
            else:
                if store.divergences:
                    out.divergences += store.divergences
                    out.problems.append(f"{table}: store {when} differs from the oracle at its offsets "
                                        f"{store.offsets}: {store.error}")
                if store.invalid_offsets and online:
                    out.divergences += 1
                    out.problems.append(f"{table}: store {when} holds offsets outside the log: {store.error}")
                for p, o in claimed.items():
                    holds = store.offsets.get(p, marks.get(p, (0, 0))[0])
                    if o > holds:
                        out.divergences += 1
                        out.problems.append(f"{table}: .checkpoint claims partition {p} at {o}, the store holds "
                                            f"{holds} ({when})")
            for snap in check_snapshots(self.broker, self.daemon.state_dir, table, topic):
                if snap.divergences and not snap.path.exists():
                    continue  # retired by retention while it was read
                out.checks += snap.visible and snap.error is None
                if snap.divergences:
                    out.divergences += snap.divergences
                    why = f": {snap.error}" if snap.error else ""
                    out.problems.append(f"{table}: snapshot {snap.path.name} {when}: {snap.divergences} keys differ "
                                        f"from the oracle at its manifest offsets{why}")
                elif snap.visible and snap.error is None:
                    self._manifest_claims(out, table, snap.path, marks, when)

    def lease_current(self) -> None:
        """Pin each table's CURRENT snapshot as a reader would, for longer than any fault lasts."""
        self.leased = {}
        for table in self.topics:
            sid = current_id(self.daemon.state_dir, table)
            if sid is not None:
                leases.take(snapshots_dir(self.daemon.state_dir, table), READER, sid, READER_LEASE_S)
                self.leased[table] = sid

    def check_readers(self, f: Fault, out: Outcome) -> None:
        """What readers rely on: a leased snapshot stays, whatever the fault (a clock step included: the daemon times
        leases on its monotonic clock), and CURRENT names a snapshot with a valid manifest."""
        state = self.daemon.state_dir
        for table, sid in self.leased.items():
            folder = snapshots_dir(state, table)
            if not (folder / sid).is_dir() and out.injected:
                out.divergences += 1
                out.problems.append(f"{table}: snapshot {sid}, leased by a reader for {READER_LEASE_S:.0f}s "
                                    f"before the fault, was deleted")
            with contextlib.suppress(OSError):
                leases.release(folder, READER)
        self.leased = {}
        if not out.injected:
            return
        for table in self.topics:
            cur = current_id(state, table)
            if cur is None:
                continue
            try:
                manifests.read(snapshots_dir(state, table) / cur, table)
            except ManifestError as e:
                out.divergences += 1
                out.problems.append(f"{table}: CURRENT names snapshot {cur}, which readers cannot open: {e}")

    def _checkpoint_claims(self, table: str, topic: str) -> tuple[dict[int, int], str | None]:
        try:
            found = checkpoint_file.read(checkpoint_path(self.daemon.state_dir, table))
        except checkpoint_file.CheckpointFormatError as e:
            return {}, str(e)
        return {p: o for (t, p), o in found.items() if t == topic}, None

    def _manifest_claims(self, out: Outcome, table: str, snap: Path, marks: dict[int, tuple[int, int]],
                         when: str) -> None:
        try:
            m = manifests.read(snap, table)
            db = snap / "db" if (snap / "db" / "CURRENT").exists() else snap
            with StoreReader(db) as r:
                holds = r.offsets()
        except (ManifestError, OSError) as e:
            if snap.exists():
                out.notes.append(f"{table}: snapshot {snap.name}: manifest or offsets unreadable: {e}")
            return
        except Exception as e:  # RocksDB reports a damaged database as a plain Exception
            if snap.exists():
                out.divergences += 1
                out.problems.append(f"{table}: snapshot {snap.name} {when}: offsets unreadable: {e}")
            return
        for p, o in m.offsets.items():
            have = holds.get(p, marks.get(p, (0, 0))[0])
            if o > have:
                out.divergences += 1
                out.problems.append(f"{table}: manifest of snapshot {snap.name} claims partition {p} at {o}, its "
                                    f"database holds {have} ({when})")
