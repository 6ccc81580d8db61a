"""The status document a running daemon publishes in its state_dir, how other processes read it and show it.

The daemon replaces ``status.json`` atomically on every state change and commit, so ``globald status`` never
opens the store or takes a lock while a daemon runs. A file left by a dead daemon is recognised by its pid.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from globald.common.errors import StoreCorruptError, StoreUnavailableError
from globald.common.states import State
from globald.settings.config import Config
from globald.status.document import ConfigStatus, DaemonStatus, DecodeStatus, TableStatus
from globald.store import checkpoint_file
from globald.store.durable import replace_file
from globald.store.names import STATUS_FILE, checkpoint_path, db_dir
from globald.store.reader import StoreReader


def write(state_dir: Path, doc: DaemonStatus) -> None:
    raw = {**doc.to_json(), "updated": time.time()}
    # Not durable (it is replaced at every commit): after a power loss the file may be empty or old, which
    # ``read_live`` takes for "no daemon" (unparsable, or a dead pid) until the next daemon writes it at start.
    replace_file(state_dir / STATUS_FILE, json.dumps(raw, sort_keys=True), durable=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return b"globald" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def _well_formed(doc: Any) -> bool:
    """The shape ``write`` publishes: anything else (truncated, foreign, tampered) is not trusted."""
    if not isinstance(doc, dict) or not isinstance(doc.get("state"), str):
        return False
    if not isinstance(doc.get("degraded"), str | None) or not isinstance(doc.get("tables", {}), dict):
        return False
    for t in doc.get("tables", {}).values():
        if not isinstance(t, dict) or not isinstance(t.get("state"), str):
            return False
        offsets = t.get("offsets", {})
        if not isinstance(offsets, dict) or not all(isinstance(o, int) for o in offsets.values()):
            return False
    return True


def read_live(state_dir: Path) -> DaemonStatus | None:
    """The running daemon's status, or None when no daemon owns ``state_dir`` (or its file cannot be trusted)."""
    try:
        doc = json.loads((state_dir / STATUS_FILE).read_bytes())
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    if not _well_formed(doc):
        return None
    pid = doc.get("pid")
    if not isinstance(pid, int) or not _alive(pid) or doc.get("state") == State.NOT_RUNNING.value:
        return None
    return DaemonStatus.from_json(doc)


def offline(config: Config) -> DaemonStatus:
    """Status with no daemon running: committed offsets from each store, else from its .checkpoint file."""
    tables: dict[str, TableStatus] = {}
    for t in config.tables:
        offsets: dict[int, int] = {}
        source = "none"
        if (db_dir(config.state_dir, t.name) / "CURRENT").exists():
            try:
                with StoreReader(db_dir(config.state_dir, t.name)) as r:
                    offsets, source = r.offsets(), "store"
            except (StoreUnavailableError, StoreCorruptError) as e:  # the daemon will rebuild a corrupt one
                source = f"unreadable store: {e}"
        if not offsets:
            try:
                found = checkpoint_file.read(checkpoint_path(config.state_dir, t.name))
                offsets = {p: o for (topic, p), o in found.items() if topic == t.topic}
                source = "checkpoint" if offsets else source
            except checkpoint_file.CheckpointFormatError:
                pass
        tables[t.name] = TableStatus(state=State.NOT_RUNNING.value, topic=t.topic, offsets=offsets, source=source)
    return DaemonStatus(state=State.NOT_RUNNING, pid=None, tables=tables)


def status_lines(doc: DaemonStatus) -> list[str]:
    """``globald status`` for people (the demo shows it too)."""
    head = f"globald: {doc.state.value}" + (f" (pid {doc.pid})" if doc.pid else "")
    if doc.ready is not None and doc.pid:
        head += ", ready" if doc.ready else f", not ready: {doc.ready_detail or ''}"
    lines = [head]
    if doc.degraded:
        lines.append(f"  degraded: {doc.degraded}")
    for b in doc.bugs:  # caught and ridden out, but a defect: say so until the process ends
        lines.append(f"  BUG at {b.get('where')}: {b.get('error')} ({b.get('count')}x, see the log)")
    if doc.http is not None:
        lines.append(f"  http: http://{doc.http.host}:{doc.http.port}/metrics")
    if doc.config is not None and doc.pid:
        lines.append(config_line(doc.config))
    for name, t in doc.tables.items():
        offsets = ", ".join(f"p{p}={o}" for p, o in sorted(t.offsets.items())) or "no offsets"
        lag = f", lag {t.lag}" if t.lag is not None else ""
        if t.last_error and not t.end_offsets:  # no log end was ever learnt (topic missing, cluster down): not 0
            lag = ", lag unknown"
        wipes = f", {t.wipes} wipe(s)" if t.wipes else ""
        lines.append(f"  {name:<20} {t.state:<12} {offsets}{lag}{wipes}")
        if t.last_error:
            lines.append(f"  {'':<20} problem: {t.last_error}")
        r = t.restore
        if r is not None:
            eta = "?" if r.eta_seconds is None else f"{r.eta_seconds:.0f}s"
            lines.append(f"  {'':<20} restoring {r.percent:.0f}%, {r.records:,} records, "
                         f"{r.records_per_second:,.0f} rec/s, ETA {eta}")
        snap = t.snapshot
        if snap is not None and snap.current:
            stale = f"  STALE: {snap.stale_reason}" if snap.stale else ""
            lines.append(f"  {'':<20} snapshot {snap.current}{stale}")
        if t.origin is not None:
            lines.append(f"  {'':<20} {origin_line(t.origin)}")
        if t.decode is not None:
            lines.append(f"  {'':<20} {decode_line(t.decode)}")
        lines += _disk_lines(doc, name)
    return lines


def config_line(c: ConfigStatus) -> str:
    """The config in force: its generation, the sha256 of its file's bytes, and the last reload, when and how it
    went (a refused one: the old config runs on, and the line says why)."""
    text = f"  config: generation {c.generation}, sha256 {c.sha256 or 'unknown'}"
    if c.clients:  # a part whose clients predate the config in force has not taken the reload yet
        text += " (clients: " + ", ".join(f"{part} {'-' if g is None else g}" for part, g in c.clients.items()) + ")"
    last = c.last_reload
    if last is None:
        return text + "; no reload yet"
    when = last.get("time")
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, int | float) else "?"
    text += f"; last reload {at} {last.get('result')}"
    return text + (f": {last.get('error')}" if last.get("result") == "refused" else "")


def origin_line(o: dict[str, Any]) -> str:
    """Where an [export] table's store came from (``export.bootstrap.Origin``): an export, and how much of the topic
    followed it, or the topic, and why no export was used."""
    kind = o.get("kind")
    if kind == "export":
        size = o.get("bytes_downloaded")
        seconds = o.get("seconds")
        text = f"origin: export {o.get('export')}"
        if isinstance(size, int) and isinstance(seconds, int | float):
            text += f" ({size / 2**20:.1f} MB in {seconds:.1f}s)"
        tail = o.get("tail")
        text += f", then {tail:,} offsets from the topic" if isinstance(tail, int) else ""
        return text + (f"; newer ones not used: {o['fallback']}" if o.get("fallback") else "")
    if kind == "store":
        return "origin: store (in the state_dir at start: no export looked for)"
    fallback = o.get("fallback")
    return f"origin: {kind}" + (f" ({fallback})" if fallback else "")


def decode_line(d: DecodeStatus) -> str:
    """A typed table's newest snapshot decoded by the daemon into its columnar file, and its decode in flight."""
    if d.snapshot is None:
        text = "decoded: nothing yet"
    elif d.too_large:
        text = f"decoded: snapshot {d.snapshot} is too large for a columnar file (readers decode per batch)"
    else:
        text = f"decoded: snapshot {d.snapshot}, {d.values:,} values, {d.errors:,} decode errors"
        if d.pending:  # a registry outage: decoded once the writer schemas can be fetched
            text += f" ({d.pending:,} pending: writer schema not yet fetched)"
        if d.key_errors:
            text += f", {d.key_errors:,} keys that do not decode (left out)"
    if d.running_pid is not None:
        text += f"; decoding CURRENT now (pid {d.running_pid})"
    if d.last_error is not None:
        text += f"; last decode failed: {d.last_error}"
    return text


def _disk_lines(doc: DaemonStatus, table: str) -> list[str]:
    """The table's disk figures, each inode once, and when short the line saying what holds the space."""
    d = (doc.disk.tables if doc.disk else {}).get(table)
    if d is None or doc.disk is None:
        return []
    free = "?" if doc.disk.free_bytes is None else f"{doc.disk.free_bytes / 2**20:.1f} MB"
    out = [f"  {'':<20} disk: live {d.get('live_bytes', 0) / 2**20:.1f} MB, snapshots "
           f"{d.get('snapshot_bytes', 0) / 2**20:.1f} MB, next step needs {d.get('need_bytes', 0) / 2**20:.1f} MB, "
           f"{free} free"]
    if d.get("short"):
        out.append(f"  {'':<20} {d['short']}")
    return out
