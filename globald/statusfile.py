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

from globald.config import Config
from globald.errors import StoreCorruptError, StoreUnavailableError
from globald.states import State
from globald.store import checkpoint_file
from globald.store.names import STATUS_FILE, checkpoint_path, db_dir
from globald.store.reader import StoreReader


def write(state_dir: Path, doc: dict[str, Any]) -> None:
    doc = {**doc, "updated": time.time()}
    path = state_dir / STATUS_FILE
    tmp = path.with_name(f"{STATUS_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True))
    os.replace(tmp, path)


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


def read_live(state_dir: Path) -> dict[str, Any] | None:
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
    return doc


def offline(config: Config) -> dict[str, Any]:
    """Status with no daemon running: committed offsets from each store, else from its .checkpoint file."""
    tables: dict[str, Any] = {}
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
        tables[t.name] = {
            "state": State.NOT_RUNNING.value,
            "topic": t.topic,
            "offsets": {str(p): o for p, o in sorted(offsets.items())},
            "source": source,
        }
    return {"state": State.NOT_RUNNING.value, "pid": None, "tables": tables}


def current(config: Config) -> dict[str, Any]:
    return read_live(config.state_dir) or offline(config)


def status_lines(doc: dict[str, Any]) -> list[str]:
    """``globald status`` for people (the demo shows it too)."""
    head = f"globald: {doc['state']}" + (f" (pid {doc['pid']})" if doc.get("pid") else "")
    if "ready" in doc and doc.get("pid"):
        head += ", ready" if doc["ready"] else f", not ready: {doc.get('ready_detail', '')}"
    lines = [head]
    if doc.get("degraded"):
        lines.append(f"  degraded: {doc['degraded']}")
    if doc.get("http"):
        lines.append(f"  http: http://{doc['http']['host']}:{doc['http']['port']}/metrics")
    for name, t in doc.get("tables", {}).items():
        offsets = ", ".join(f"p{p}={o}" for p, o in t.get("offsets", {}).items()) or "no offsets"
        lag = f", lag {t['lag']}" if "lag" in t else ""
        wipes = f", {t['wipes']} wipe(s)" if t.get("wipes") else ""
        lines.append(f"  {name:<20} {t['state']:<12} {offsets}{lag}{wipes}")
        r = t.get("restore")
        if r:
            eta = "?" if r.get("eta_seconds") is None else f"{r['eta_seconds']:.0f}s"
            lines.append(f"  {'':<20} restoring {r['percent']:.0f}%, {r['records']:,} records, "
                         f"{r['records_per_second']:,.0f} rec/s, ETA {eta}")
        snap = t.get("snapshot")
        if snap and snap.get("current"):
            stale = f"  STALE: {snap.get('stale_reason')}" if snap.get("stale") else ""
            lines.append(f"  {'':<20} snapshot {snap['current']}{stale}")
    return lines
