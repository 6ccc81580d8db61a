"""``python -m bench.export_bootstrap``: a new host RUNNING from an export against from the topic (issue 34), in one
run on an embedded broker, and the bytes an incremental export uploads against a full one.

    python -m bench.export_bootstrap --records 1000000 --tail 0.01

Prints one JSON object: seconds from start to RUNNING for a host restoring from the topic and for one bootstrapping
from a local-directory export (the tail: ``--tail`` times the records, then as many again), the bootstrap's bytes,
seconds and tail, and each export's ``uploaded_bytes`` (incremental) against its ``bytes`` (a full export's).
Not yet part of ``python -m bench``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.harness import DaemonProcess, random_records, start_broker, write_config

TABLE = "tbl"


def _status(state: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads((state / "status.json").read_text())
        return doc
    except (OSError, ValueError):
        return {}


def _running_after(d: DaemonProcess, state: Path, ends: dict[int, int], timeout: float = 1800) -> tuple[float, dict]:
    """Start ``d``; seconds until its status says RUNNING at ``ends`` (status.json read every 20 ms)."""
    started = time.monotonic()
    d.start()
    want = {str(p): o for p, o in ends.items()}
    while time.monotonic() - started < timeout:
        doc = _status(state)
        table = (doc.get("tables") or {}).get(TABLE) or {}
        if doc.get("pid") == d.pid and table.get("state") == "RUNNING" and table.get("offsets") == want:
            return time.monotonic() - started, doc
        time.sleep(0.02)
    raise TimeoutError(d.tail())


def _export(d: DaemonProcess, root: Path, ends: dict[int, int]) -> dict[str, Any]:
    want = {str(p): o for p, o in ends.items()}
    while True:
        r = subprocess.run([sys.executable, "-m", "globald", "export", "--config", str(d.config), "--table", TABLE,
                            "--json"], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr
        done: dict[str, Any] = json.loads(r.stdout)
        manifest = json.loads((root / TABLE / "exports" / f"{done['export']}.json").read_text())
        if manifest["offsets"] == want:
            done["bytes"] = sum(f["size"] for f in manifest["files"])
            return done
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.export_bootstrap", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--tail", type=float, default=0.01, help="records produced after the export, as a fraction")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="globald-bench-export-"))
    broker = start_broker(work / "kafka")
    try:
        topic = "bench-export"
        broker.admin.create(topic, partitions=3)
        for start in range(0, args.records, 200_000):
            n = min(200_000, args.records - start)
            broker.admin.produce(topic, random_records(n, keys=args.records, seed=start, tombstones=0.0,
                                                       value_size=100))
        root = work / "exports"
        export = {"uri": root.as_uri(), "interval_s": 0}
        common: dict[str, Any] = {"commit_interval_ms": 1000, "metadata_refresh_ms": 500, "http": {"enabled": False}}

        def daemon(name: str, **top: Any) -> tuple[DaemonProcess, Path]:
            state = work / name
            cfg = write_config(work / f"{name}.toml", state, broker.settings, {TABLE: topic}, **common, **top)
            return DaemonProcess(cfg, work / f"{name}.log"), state

        exporter, state = daemon("exporter", export=export)
        _running_after(exporter, state, broker.admin.end_offsets(topic))
        first = _export(exporter, root, broker.admin.end_offsets(topic))
        tail = int(args.records * args.tail)
        broker.admin.produce(topic, random_records(tail, keys=args.records, seed=-1, tombstones=0.0, value_size=100))
        ends = broker.admin.end_offsets(topic)
        second = _export(exporter, root, ends)  # right after the restore: compactions rewrite most files
        broker.admin.produce(topic, random_records(tail, keys=args.records, seed=-2, tombstones=0.0, value_size=100))
        ends = broker.admin.end_offsets(topic)
        third = _export(exporter, root, ends)  # steady state: what one more interval's export uploads
        exporter.stop()
        for later in (second, third):  # bootstrap from the first: a real tail
            (root / TABLE / "exports" / f"{later['export']}.json").unlink()
        from_topic, state = daemon("from-topic")
        topic_s, _ = _running_after(from_topic, state, ends)
        from_topic.stop()
        from_export, state = daemon("from-export", export=export)
        export_s, doc = _running_after(from_export, state, ends)
        from_export.stop()
        origin = doc["tables"][TABLE]["origin"]
        print(json.dumps({
            "records": args.records, "tail_records": tail,
            "running_from_topic_s": round(topic_s, 2), "running_from_export_s": round(export_s, 2),
            "ratio": round(export_s / topic_s, 3), "origin": origin,
            "exports": {"first": first, "after_tail": second, "after_another_tail": third},
        }, indent=1))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
