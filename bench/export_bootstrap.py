"""``python -m bench.export_bootstrap``: a new host RUNNING from an export against from the topic (issue 34), in one
run on an embedded broker; the broker bytes each of the two hosts received; the bytes incremental exports upload
against full ones, per export and per hour under the default load.

    python -m bench.export_bootstrap --records 1000000            # the small form (make bench)
    python -m bench.export_bootstrap --records 10000000           # the 10M-key figure (make bench-export-10m)

The table: ``--records`` distinct keys of 100-byte values in a 3-partition topic. A first host restores it and
exports it (a local-directory target); ``--tail`` times the records are then overwritten twice, each followed by an
export (what an incremental export uploads). The two later exports are then removed, so that a new host
bootstrapping from the first one has a real tail (2 x ``--tail`` x records) to replay. Then, in the same run:
 * a new host with an empty state_dir and no export restores from the topic: seconds from start to RUNNING at the
   log end, and the bytes its Kafka clients received from the broker (librdkafka statistics: ``statistics.interval.ms``
   set in the ``[kafka]`` section of the config the bench writes, the brokers' ``rxbytes`` summed over every client,
   read through ``bench.rxstats``);
 * a new host with an empty state_dir bootstraps from the export: the same two figures, and its status's origin.
 * Uploads per hour under the default load (2,000 records/s over the table's keys, the soak's default rate), time
   accelerated ``--speedup`` times: the first host exports every 300 / speedup s while a producer writes
   2,000 x speedup records/s for ``--load-minutes``; each export then covers what 300 s of the default load writes.
   Per hour = 12 exports (interval_s = 300) x the mean export's uploaded bytes (incremental), against 12 x the mean
   export's size (full exports: every file uploaded each time). The first export of the window is left out (it
   covers the time before the load).
Prints the result as JSON and writes it to ``--out``/export-bootstrap-<size>.json.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from bench import rxstats
from tests.harness import DaemonProcess, start_broker, write_config

TABLE = "tbl"
TOPIC = "bench-export"
VALUE_SIZE = 100
DEFAULT_RATE = 2_000  # records/s: the default load (tests/soak.py, docs/limitations.md)
DEFAULT_INTERVAL_S = 300  # [export] interval_s's default
RESULTS = Path(__file__).resolve().parent / "results"


def _records(keys: Iterator[int], seed: int) -> Iterator[tuple[bytes, bytes]]:
    rnd = random.Random(seed)
    for k in keys:
        yield b"key-%09d" % k, rnd.randbytes(VALUE_SIZE)


def status_doc(state: Path) -> dict[str, Any]:
    """The daemon's status.json in ``state``; {} while there is none (or it is being replaced)."""
    try:
        doc: dict[str, Any] = json.loads((state / "status.json").read_text())
        return doc
    except (OSError, ValueError):
        return {}


def _table(state: Path) -> dict[str, Any]:
    t: dict[str, Any] = (status_doc(state).get("tables") or {}).get(TABLE) or {}
    return t


def _running_after(d: DaemonProcess, state: Path, ends: dict[int, int], timeout: float = 3600) -> tuple[float, dict]:
    """Start ``d``; seconds until its status says RUNNING at ``ends`` (status.json read every 20 ms)."""
    started = time.monotonic()
    d.start()
    want = {str(p): o for p, o in ends.items()}
    while time.monotonic() - started < timeout:
        doc = status_doc(state)
        table = (doc.get("tables") or {}).get(TABLE) or {}
        if doc.get("pid") == d.pid and table.get("state") == "RUNNING" and table.get("offsets") == want:
            return time.monotonic() - started, doc
        if not d.alive():
            raise RuntimeError(d.tail())
        time.sleep(0.02)
    raise TimeoutError(d.tail())


# What a new host's log says as its start goes by (its own wording), in order: the breakdown of its seconds to RUNNING.
_MILESTONES = (("started (interpreter, imports, config checks)", "starting on"),
               ("store opened, looking for an export", "looking for an export"),
               ("export downloaded, checked and installed", "store installed from the export storage"),
               ("bootstrap done, tail started", "bootstrapped from export"),
               ("restored: the tail replayed", ": restored "),
               ("RUNNING", "daemon state RESTORING -> RUNNING"))


def breakdown(log: str, spawned: float) -> dict[str, float]:
    """Seconds after ``spawned`` (epoch) at which the daemon logged each milestone it reached (its first such line)."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        for name, words in _MILESTONES:
            if name not in out and words in line:
                out[name] = round(at - spawned, 3)
    return out


def _received(stats: Path, since: float, interval_s: float, timeout: float = 120) -> int:
    """Bytes every Kafka client of the daemon received, from emissions at least one interval after ``since``
    (the daemon stays up meanwhile: the figure then includes everything it fetched to reach RUNNING)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = rxstats.received(stats)
        if seen and max(c["at"] for c in seen.values()) > since + 1.5 * interval_s:
            return int(sum(c["rxbytes"] for c in seen.values()))
        time.sleep(0.1)
    raise TimeoutError(f"no librdkafka statistics in {stats}")


def _export(d: DaemonProcess, root: Path, ends: dict[int, int]) -> dict[str, Any]:
    """Export until the export is at ``ends`` (the daemon exports its newest verified snapshot, which may still be
    an older one): its ``uploaded_bytes`` are every attempt's, what it took to go from the last export to this."""
    want = {str(p): o for p, o in ends.items()}
    uploaded = attempts = 0
    while True:
        r = subprocess.run([sys.executable, "-m", "globald", "export", "--config", str(d.config), "--table", TABLE,
                            "--json"], capture_output=True, text=True, timeout=1800)
        assert r.returncode == 0, r.stderr
        done: dict[str, Any] = json.loads(r.stdout)
        uploaded, attempts = uploaded + done["uploaded_bytes"], attempts + 1
        manifest = json.loads((root / TABLE / "exports" / f"{done['export']}.json").read_text())
        if manifest["offsets"] == want:
            return {**done, "uploaded_bytes": uploaded, "attempts": attempts,
                    "bytes": sum(f["size"] for f in manifest["files"])}
        time.sleep(0.5)


def _paced(settings: dict[str, Any], rate: int, seconds: float, keys: int, stop: threading.Event) -> int:
    """Overwrites of the table's keys, uniformly, at ``rate`` records/s (a tenth of a second's worth at a time)."""
    producer = Producer({**settings, "linger.ms": 20, "log_level": 3, "queue.buffering.max.messages": 1_000_000})
    rnd, sent, start = random.Random(11), 0, time.monotonic()
    while not stop.is_set() and time.monotonic() - start < seconds:
        owed = int(rate * (time.monotonic() - start)) - sent
        for key, value in _records((rnd.randrange(keys) for _ in range(max(owed, 0))), rnd.randrange(1 << 30)):
            while True:
                try:
                    producer.produce(TOPIC, key=key, value=value)
                    break
                except BufferError:
                    producer.poll(0.05)
        sent += max(owed, 0)
        producer.poll(0)
        stop.wait(0.1)
    producer.flush(60)
    return sent


def _uploads_per_hour(exporter: DaemonProcess, state: Path, settings: dict[str, Any], keys: int, minutes: float,
                      speedup: int) -> dict[str, Any]:
    interval = DEFAULT_INTERVAL_S / speedup
    rate = DEFAULT_RATE * speedup
    exporter.start()
    seen: dict[str, dict[str, Any]] = {}
    stop = threading.Event()
    produced: list[int] = []
    load = threading.Thread(target=lambda: produced.append(_paced(settings, rate, minutes * 60, keys, stop)))
    load.start()
    try:
        while load.is_alive():
            last = (_table(state).get("export") or {}).get("last")
            if last and last["export"] not in seen:
                seen[last["export"]] = {k: last[k] for k in ("bytes", "uploaded_bytes", "shared_bytes", "seconds")}
            time.sleep(0.5)
    finally:
        stop.set()
        load.join()
        exporter.stop()
    counted = list(seen.values())[1:]  # the first covers the time before the load
    if not counted:
        return {"error": f"fewer than two exports in {minutes} min at interval_s = {interval}"}
    per_hour = 3600 / DEFAULT_INTERVAL_S
    mean_up = sum(e["uploaded_bytes"] for e in counted) / len(counted)
    mean_full = sum(e["bytes"] for e in counted) / len(counted)
    return {
        "load": f"{DEFAULT_RATE} records/s over the table's keys, accelerated {speedup}x: {rate} records/s, "
                f"interval_s = {interval:g}, {minutes:g} min ({produced[0] if produced else 0} records)",
        "scaled": f"per hour = {per_hour:g} exports (interval_s = {DEFAULT_INTERVAL_S}) x the mean export's bytes; "
                  f"each export covers {DEFAULT_INTERVAL_S} s of the default load",
        "exports_counted": len(counted), "exports": counted,
        "incremental_bytes_per_hour": int(mean_up * per_hour), "full_bytes_per_hour": int(mean_full * per_hour),
        "ratio_incremental_to_full": round(mean_up / mean_full, 4) if mean_full else None,
    }


def size_name(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.export_bootstrap", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=1_000_000, help="distinct keys in the table")
    p.add_argument("--tail", type=float, default=0.01, help="records overwritten after each export, as a fraction")
    p.add_argument("--stats-ms", type=int, default=1000, help="statistics.interval.ms of the two new hosts")
    p.add_argument("--load-minutes", type=float, default=3.0, help="wall minutes of accelerated default load; 0: skip")
    p.add_argument("--speedup", type=int, default=6, help="time acceleration of the default load")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--scratch", type=Path, default=None, help="parent of the scratch directory (default $TMPDIR)")
    p.add_argument("--keep-log", type=Path, default=None, help="where to copy the bootstrapping host's log")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # the finally stops the broker
    started = time.monotonic()

    def progress(msg: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {msg}", file=sys.stderr, flush=True)

    work = Path(tempfile.mkdtemp(prefix="globald-bench-export-", dir=args.scratch))
    broker = start_broker(work / "kafka")
    try:
        broker.admin.create(TOPIC, partitions=3)
        progress(f"producing {args.records:,} records")
        for start in range(0, args.records, 500_000):
            broker.admin.produce(TOPIC, _records(iter(range(start, min(start + 500_000, args.records))), start))
        root = work / "exports"
        export = {"uri": root.as_uri(), "interval_s": 0, "keep": 100, "bootstrap_timeout_s": 3600}  # the first is kept
        common: dict[str, Any] = {"commit_interval_ms": 1000, "metadata_refresh_ms": 500, "http": {"enabled": False}}

        def daemon(name: str, stats: bool = False, **top: Any) -> tuple[DaemonProcess, Path]:
            state = work / name
            settings = {**broker.settings, "statistics.interval.ms": args.stats_ms} if stats else broker.settings
            cfg = write_config(work / f"{name}.toml", state, settings, {TABLE: TOPIC}, **common, **top)
            d = DaemonProcess(cfg, work / f"{name}.log")
            if stats:
                d.module, d.env = "bench.rxstats", {rxstats.ENV: str(work / f"{name}.rx.json")}
            return d, state

        def tail(seed: int) -> dict[int, int]:
            rnd = random.Random(seed)
            n = int(args.records * args.tail)
            broker.admin.produce(TOPIC, _records((rnd.randrange(args.records) for _ in range(n)), seed))
            return broker.admin.end_offsets(TOPIC)

        exporter, exporter_state = daemon("exporter", export=export)
        progress("first host: restore from the topic")
        _running_after(exporter, exporter_state, broker.admin.end_offsets(TOPIC))
        first = _export(exporter, root, broker.admin.end_offsets(TOPIC))
        progress(f"exported {first['bytes']:,} bytes")
        second = _export(exporter, root, tail(-1))  # right after the restore: compactions rewrite most files
        ends = tail(-2)
        third = _export(exporter, root, ends)  # what one more interval's export uploads
        exporter.stop()
        for later in (root / TABLE / "exports").glob("*.json"):  # bootstrap from the first: a real tail
            if later.stem != first["export"]:
                later.unlink()
        log_bytes = sum(f.stat().st_size for f in (work / "kafka").rglob("*.log"))

        progress("new host from the topic")
        from_topic, state = daemon("from-topic", stats=True)
        topic_s, _ = _running_after(from_topic, state, ends)
        topic_rx = _received(work / "from-topic.rx.json", time.time(), args.stats_ms / 1000)
        from_topic.stop()
        progress(f"from the topic: {topic_s:.1f} s; new host from the export")
        from_export, state = daemon("from-export", stats=True, export=export)
        spawned = time.time()
        export_s, doc = _running_after(from_export, state, ends)
        export_rx = _received(work / "from-export.rx.json", time.time(), args.stats_ms / 1000)
        from_export.stop()
        host_log = from_export.log.read_text(errors="replace")
        if args.keep_log is not None:
            args.keep_log.write_text(host_log)
        steps = breakdown(host_log, spawned)
        # The bootstrap's own split (download, the broker's checks beside it, open and check, sync and install)
        split = [line[24:] for line in host_log.splitlines() if "the broker's checks took" in line]
        progress(f"from the export: {export_s:.1f} s: {steps}")
        origin = doc["tables"][TABLE]["origin"]
        result: dict[str, Any] = {
            "command": " ".join(["python -m bench.export_bootstrap", *(argv if argv is not None else sys.argv[1:])]),
            "records": args.records, "tail_records": 2 * int(args.records * args.tail),
            "running_from_topic_s": round(topic_s, 2), "running_from_export_s": round(export_s, 2),
            "ratio": round(export_s / topic_s, 3), "origin": origin,
            "from_export_breakdown_s": steps,  # seconds after the spawn, from the new host's log
            "bootstrap_split": split[0] if split else None,
            "broker_bytes": {"topic_log_bytes": log_bytes, "from_topic_rxbytes": topic_rx,
                             "from_export_rxbytes": export_rx,
                             "ratio": round(export_rx / topic_rx, 4) if topic_rx else None},
            "exports": {"first": first, "after_tail": second, "after_another_tail": third},
        }
        if args.load_minutes > 0:
            progress(f"uploads under the default load, {args.load_minutes:g} min accelerated {args.speedup}x")
            exporter, _ = daemon("exporter", export={**export, "interval_s": DEFAULT_INTERVAL_S // args.speedup})
            result["uploads_per_hour"] = _uploads_per_hour(exporter, exporter_state, broker.settings, args.records,
                                                           args.load_minutes, args.speedup)
        result["seconds"] = round(time.monotonic() - started, 1)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"export-bootstrap-{size_name(args.records)}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(result, indent=1))
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
