"""The broker-restart wedge, outside the daemon: does a librdkafka consumer set up as globald's stay silent after its
0.9 broker is SIGKILLed and restarted on the same port with the same data?

An accelerated soak (seed 2613, docs/testing/reliability.md) saw the daemon's consumer hear nothing for 9 minutes
after such a restart while a new client was answered at once; the daemon now replaces a consumer silent for 30 s
(``engine/cluster_watch.Renew``). This probe looks for the cause: one embedded 0.9 broker, one producer, and one
``confluent_kafka.Consumer`` with the daemon's consumer settings (``consumer_settings``: its managed properties and
defaults, plus the 0.9 client settings), assigned to three partitions at explicit offsets, polled without blocking
as the loop polls. Each cycle SIGKILLs the broker at a random point (the consumer idle at the end, catching up a
backlog, under a steady produce, or killed again while reconnecting), restarts it on the same port, and measures how
long the consumer takes to get records again. A cycle silent past ``--bound`` seconds is written to ``--out``:
librdkafka's debug log (``--debug`` contexts) since the kill, its statistics (per broker and per partition: state,
fetch_state, leader, fetchq_cnt, next_offset), native stacks (gdb), and in the cycle's line the consumer's positions
beside a new client's ends. Positions behind the ends: the consumer wedged; equal: nothing new was produced (a
producer that took the topic as gone, see ``--producer-renew-after``).

Run: ``PYTHONPATH=$PWD python -m tests.support.wedge_probe --topics soak-customers,soak-products --list-every 0
--minutes 30 --out /tmp/wedge`` (``--help``). Not a test: it runs for as long as it is told, and prints one line per
cycle and a summary. Run it from a copy of the tree (``git archive HEAD globald tests``) when editing meanwhile: the
``--via-proxy`` forwarder (``tests.support.tcp_forwarder``) is started anew at every cycle. Findings:
docs/testing/reliability.md. Not shipped in the wheel.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from globald.embedded.broker import free_port
from globald.settings.kafka_properties import consumer_settings
from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka
from tests.support.tcp_forwarder import Proxy

# --topics: how many, and how long their names are, decides whether librdkafka parses an empty cluster's answer.
TOPICS = ["wedge"]
PARTITIONS = 3
# flap: killed again (up to three times) within a second of each restart, while the client is reconnecting.
KILL_POINTS = ("idle", "fetch", "produce", "flap")
# librdkafka debug lines counted in every cycle (lower case): what the restarted broker answered, and what the
# client did with it. A 0.9 broker answers requests before its controller has told it the cluster's brokers.
MARKERS = {"no_brokers": " 0 brokers, ", "protoerr": "not enough room in tmpabuf", "notexists": "exists -> notexists",
           "decommission": "decommission", "rebootstrap": "rebootstrap",
           "unknown_topic": "unknown topic", "leader_none": "leader -1"}


class Ring(logging.Handler):
    """librdkafka's log lines (through ``logger=``), kept in memory with the monotonic time they arrived."""

    def __init__(self, size: int) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[tuple[float, str]] = collections.deque(maxlen=size)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))

    def count(self, t: float) -> dict[str, int]:
        lines = [line.lower() for ts, line in list(self.lines) if ts >= t]
        return {k: n for k, m in MARKERS.items() if (n := sum(m in line for line in lines))}

    def since(self, t: float) -> list[str]:
        return [f"{ts:.3f} {line}" for ts, line in list(self.lines) if ts >= t]


class Load(threading.Thread):
    """A producer at ``rate`` records/s over the partitions while ``running`` is set; ``burst`` queues more."""

    def __init__(self, settings: dict[str, Any], rate: int, renew_after: float) -> None:
        super().__init__(name="wedge-load", daemon=True)
        self.renew_after = renew_after
        self._settings = {**settings, "linger.ms": 20, "message.timeout.ms": 120_000,
                          "queue.buffering.max.messages": 1_000_000, "log_level": 0}
        self.producer = self._new()
        self.refused_since = 0.0
        self.renewed = 0  # producers replaced: one that took the topic as gone stays so until its periodic refresh
        self.rate = rate
        self.running = threading.Event()
        self.done = threading.Event()
        self.sent = 0
        self.refused = 0

    def _new(self) -> Producer:
        return Producer(self._settings)

    def burst(self, n: int) -> None:
        for i in range(n):
            self._send(i)
        self.producer.poll(0)

    def _send(self, i: int) -> None:
        try:
            self.producer.produce(TOPICS[i % len(TOPICS)], key=b"k%d" % (i % 5000), value=b"v" * 100,
                                  partition=(i // len(TOPICS)) % PARTITIONS)
            self.sent += 1
        except BufferError:
            self.producer.poll(0.1)
        except KafkaException:  # the topic taken as gone (an empty cluster's answer after a restart)
            self.refused += 1
            now = time.monotonic()
            self.refused_since = self.refused_since or now
            # This producer would wait for its next periodic refresh: a new one (0: never, to measure that wait).
            if self.renew_after > 0 and now - self.refused_since > self.renew_after:
                self.producer.flush(0)
                self.producer = self._new()
                self.renewed += 1
                self.refused_since = 0.0
            time.sleep(0.01)
            return
        self.refused_since = 0.0

    def run(self) -> None:
        i = 0
        while not self.done.is_set():
            if not self.running.wait(0.1):
                continue
            for _ in range(max(1, self.rate // 20)):
                self._send(i)
                i += 1
            self.producer.poll(0)
            time.sleep(0.05)


class Watched:
    """The consumer under test, polled on the main thread only (as the daemon's loop polls its own)."""

    def __init__(self, settings: dict[str, Any], ring: Ring, stats_keep: int, list_every: float) -> None:
        self.stats: collections.deque[tuple[float, str]] = collections.deque(maxlen=stats_keep)
        self.errors: collections.deque[tuple[float, str]] = collections.deque(maxlen=1000)
        log = logging.getLogger("wedge.librdkafka")
        log.setLevel(logging.DEBUG)
        log.addHandler(ring)
        log.propagate = False
        self.consumer = Consumer({**settings, "logger": log,
                                  "stats_cb": lambda s: self.stats.append((time.monotonic(), s)),
                                  "error_cb": lambda e: self.errors.append((time.monotonic(), str(e)))})
        self.positions = {f"{t}[{p}]": 0 for t in TOPICS for p in range(PARTITIONS)}
        self.consumer.assign([TopicPartition(t, p, 0) for t in TOPICS for p in range(PARTITIONS)])
        self.last_record = 0.0
        self.records = 0
        self.list_every = list_every
        self._next_list = 0.0
        self.list_failures = 0

    def turn(self) -> None:
        """One turn of a loop like the daemon's: non-blocking polls, a short wait when the queue is empty, and (as
        the daemon's probe did at the time of the soak) a metadata listing on this consumer every ``list_every``
        seconds while it hears nothing."""
        got = 0
        for m in self.consumer.consume(1000, 0):
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    self.errors.append((time.monotonic(), f"message error: {err}"))
                continue
            self.positions[f"{m.topic()}[{m.partition()}]"] = (m.offset() or 0) + 1
            got += 1
        now = time.monotonic()
        if got:
            self.records += got
            self.last_record = now
            return
        if self.list_every > 0 and now >= self._next_list and now - self.last_record > 1.0:
            self._next_list = now + self.list_every
            try:
                self.consumer.list_topics(timeout=1.0)
            except KafkaException:
                self.list_failures += 1
        time.sleep(0.02)


def ends(settings: dict[str, Any]) -> dict[str, int]:
    """The partitions' ends, asked by a new client (the "new client answered at once" of the soak)."""
    c = Consumer({**settings, "group.id": "wedge-probe-fresh", "log_level": 0})
    try:
        out = {}
        for t in TOPICS:
            for p in range(PARTITIONS):
                out[f"{t}[{p}]"] = c.get_watermark_offsets(TopicPartition(t, p), timeout=10, cached=False)[1]
        return out
    finally:
        c.close()


class Cycles(threading.Thread):
    """Kills and restarts the broker, cycle after cycle, and measures how long the consumer stays silent."""

    def __init__(self, args: argparse.Namespace, kafka: EmbeddedKafka, load: Load, watched: Watched,
                 ring: Ring, plain: dict[str, Any], proxy: Proxy | None) -> None:
        super().__init__(name="wedge-cycles", daemon=True)
        self.proxy = proxy
        self.args, self.kafka, self.load, self.watched, self.ring, self.plain = args, kafka, load, watched, ring, plain
        self.rnd = random.Random(args.seed)
        self.results: list[dict[str, Any]] = []
        self.finished = threading.Event()
        self.stop = threading.Event()  # SIGINT/SIGTERM: end after the cycle under way

    def run(self) -> None:
        try:
            deadline = time.monotonic() + self.args.minutes * 60
            n = 0
            while time.monotonic() < deadline and n < self.args.cycles and not self.stop.is_set():
                n += 1
                self.cycle(n)
        finally:
            self.finished.set()

    def _caught_up(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                want = ends(self.plain)
            except KafkaException:
                time.sleep(1)
                continue
            if all(self.watched.positions[p] >= e for p, e in want.items()):
                return True
            time.sleep(0.5)
        return False

    def cycle(self, n: int) -> None:
        point = self.rnd.choice(self.args.points.split(","))
        down = self.rnd.uniform(0, self.args.down_max)
        if point == "idle":
            self.load.running.clear()
            self.load.producer.flush(30)
            self._caught_up(60)
            time.sleep(self.rnd.uniform(0, 3))
        elif point == "fetch":
            self.load.running.clear()
            self.load.producer.flush(30)
            self._caught_up(60)
            self.load.burst(self.args.burst)
            self.load.producer.flush(30)
            time.sleep(self.rnd.uniform(0, 0.5))  # killed while the consumer fetches the backlog
        else:
            self.load.running.set()
            time.sleep(self.rnd.uniform(0.5, 3))
        killed = time.monotonic()
        if point == "flap":
            for _ in range(self.rnd.randint(1, 3)):
                self._kill_restart(self.rnd.uniform(0, 2))
                time.sleep(self.rnd.uniform(0, 1))
        pid = self._kill_restart(down)
        ready = time.monotonic()
        self.load.running.set()
        result: dict[str, Any] = {"cycle": n, "point": point, "down_s": round(down, 2), "old_pid": pid,
                                  "restart_s": round(ready - killed - down, 2)}
        silent = self._wait_records(ready, self.args.bound)
        if silent is None:
            result.update(self._wedged(n, killed, ready))
        else:
            result["silent_s"] = round(silent, 2)
        result["seen"] = self.ring.count(killed)
        result["producers_renewed"] = self.load.renewed
        result["produce_refused"] = self.load.refused  # both since the start
        self.results.append(result)
        print(json.dumps(result), flush=True)

    def _kill_restart(self, down: float) -> int | None:
        if self.proxy is not None:
            pid = self.proxy.kill()
            time.sleep(down)
            self.proxy.start()
            return pid
        pid = self.kafka.broker_pid
        self.kafka.stop_broker(signal.SIGKILL)
        time.sleep(down)
        self.kafka.start_broker(timeout=120)
        return pid

    def _wait_records(self, since: float, bound: float) -> float | None:
        end = since + bound
        while time.monotonic() < end:
            if self.watched.last_record > since:
                return self.watched.last_record - since
            time.sleep(0.05)
        return None

    def _wedged(self, n: int, killed: float, ready: float) -> dict[str, Any]:
        """Silent past the bound: record the state, then wait up to --max-wait for it to end on its own."""
        out = Path(self.args.out)
        out.mkdir(parents=True, exist_ok=True)
        fresh: dict[str, Any]
        try:
            fresh = dict(ends(self.plain))
        except KafkaException as e:
            fresh = {"error": str(e)}
        (out / f"cycle{n}-debug.log").write_text("\n".join(self.ring.since(killed - 2)) + "\n")
        (out / f"cycle{n}-stats.jsonl").write_text("".join(
            f'{{"t": {t - killed:.3f}, "stats": {s}}}\n' for t, s in list(self.watched.stats) if t >= killed - 2))
        (out / f"cycle{n}-errors.txt").write_text("".join(
            f"{t - killed:.3f} {e}\n" for t, e in list(self.watched.errors) if t >= killed - 2))
        try:  # librdkafka's threads, native stacks: a thread blocked for good shows here
            bt = subprocess.run(["gdb", "-p", str(os.getpid()), "-batch", "-ex", "thread apply all bt"],
                                capture_output=True, text=True, timeout=180)
            (out / f"cycle{n}-threads.txt").write_text(bt.stdout + bt.stderr)
        except (OSError, subprocess.TimeoutExpired) as e:
            (out / f"cycle{n}-threads.txt").write_text(f"no stacks: {e}\n")
        info: dict[str, Any] = {"wedged": True, "positions": dict(self.watched.positions), "fresh_ends": fresh}
        more = self._wait_records(ready, self.args.max_wait)
        info["silent_s"] = round(more, 2) if more is not None else f">{self.args.max_wait}"
        (out / f"cycle{n}-debug-after.log").write_text("\n".join(self.ring.since(ready + self.args.bound)) + "\n")
        return info


def main() -> None:
    global TOPICS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--cycles", type=int, default=10**9)
    p.add_argument("--bound", type=float, default=30, help="silence (s) after the restart that counts as a wedge")
    p.add_argument("--max-wait", type=float, default=150, help="how long a wedged cycle is watched (s)")
    p.add_argument("--down-max", type=float, default=4, help="longest time (s) the broker stays down")
    p.add_argument("--rate", type=int, default=2000, help="records/s of the steady load")
    p.add_argument("--burst", type=int, default=200_000, help="backlog made before a 'fetch' kill")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--points", default=",".join(KILL_POINTS), help=f"kill points to draw from ({KILL_POINTS})")
    p.add_argument("--list-every", type=float, default=1.0,
                   help="seconds between metadata listings on the consumer while it hears nothing (0: none)")
    p.add_argument("--debug", default="broker,topic,fetch,metadata,protocol")
    p.add_argument("--ring", type=int, default=400_000, help="librdkafka log lines kept in memory")
    p.add_argument("--stats-ms", type=int, default=1000)
    p.add_argument("--set", action="append", default=[], metavar="PROP=VALUE",
                   help="a consumer property added to the daemon's (the fix under test)")
    p.add_argument("--producer-set", action="append", default=[], metavar="PROP=VALUE",
                   help="a property of the load's producer")
    p.add_argument("--producer-renew-after", type=float, default=2.0,
                   help="seconds a producer may refuse the topic before it is replaced (0: never)")
    p.add_argument("--out", default="/tmp/wedge-probe")
    p.add_argument("--run-dir", default=None, help="the broker's directory (default: a new temporary one)")
    p.add_argument("--via-proxy", action="store_true",
                   help="kill and restart a TCP forwarder in front of the broker instead of the broker (fast cycles)")
    p.add_argument("--topics", default=",".join(TOPICS), help="topics of 3 partitions each, comma-separated")
    args = p.parse_args()

    TOPICS = args.topics.split(",")
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="wedge-probe-"))
    proxy: Proxy | None = None
    if args.via_proxy:  # the broker advertises the proxy's port: every client connects through it
        kafka = EmbeddedKafka(run_dir / "kafka", port=free_port())
        proxy = Proxy(free_port(), kafka.port)
        kafka.broker_props = {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy.listen}"}
        proxy.start()
        kafka.start()
    else:
        kafka = EmbeddedKafka(run_dir / "kafka").start()
    try:
        plain = kafka.client_settings if proxy is None else {**kafka.client_settings,
                                                              "bootstrap.servers": f"127.0.0.1:{proxy.listen}"}
        admin = TopicAdmin.for_broker(plain, kafka.zookeeper)
        for t in TOPICS:
            admin.create(t, partitions=PARTITIONS)
        extra = dict(kv.split("=", 1) for kv in args.set)
        settings = {**consumer_settings({**plain, **extra}), "statistics.interval.ms": args.stats_ms}
        if args.debug:
            settings["debug"] = args.debug
        print(json.dumps({"librdkafka": __import__("confluent_kafka").libversion()[0], "broker": kafka.bootstrap,
                          "run_dir": str(run_dir), "extra": extra, "pid": os.getpid()}), flush=True)
        ring = Ring(args.ring)
        watched = Watched(settings, ring, stats_keep=600, list_every=args.list_every)
        load = Load({**plain, **dict(kv.split("=", 1) for kv in args.producer_set)}, args.rate,
                    args.producer_renew_after)
        load.start()
        load.running.set()
        cycles = Cycles(args, kafka, load, watched, ring, plain, proxy)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: cycles.stop.set())
        # SIGUSR1: write the log kept in memory (the last --ring lines), to see a cycle that recovered.
        def dump(*_: object) -> None:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"ring-{time.monotonic():.0f}.log").write_text("\n".join(ring.since(0)) + "\n")

        signal.signal(signal.SIGUSR1, dump)
        cycles.start()
        while not cycles.finished.is_set():
            watched.turn()
        load.done.set()
        wedged = [r for r in cycles.results if r.get("wedged")]
        behind = [r for r in wedged if r["positions"] != r["fresh_ends"]]  # the consumer's own silence
        silent = sorted(r["silent_s"] for r in cycles.results if not r.get("wedged"))
        print(json.dumps({"cycles": len(cycles.results), "wedged": len(wedged), "consumer_wedged": len(behind),
                          "by_point": dict(collections.Counter(r["point"] for r in cycles.results)),
                          "wedged_by_point": dict(collections.Counter(r["point"] for r in wedged)),
                          "silent_median_s": silent[len(silent) // 2] if silent else None,
                          "silent_max_s": silent[-1] if silent else None,
                          "records": watched.records, "list_failures": watched.list_failures,
                          "producers_renewed": load.renewed}), flush=True)
        watched.consumer.close()
    finally:
        kafka.stop()
        if proxy is not None:
            proxy.kill()


if __name__ == "__main__":
    main()
