"""``globald dev``: a local Kafka to try globald by hand, with a seeded compacted topic and a ready config.

It starts the bundled Kafka 0.9 broker (and ZooKeeper) on free loopback ports, creates and seeds a compacted
``customers`` topic, creates the empty compacted topics that ``--topic`` names (a 0.9 broker has no CreateTopics
API and its auto-creation is off, so a producer to a missing topic only times out: this is the way to get one),
with the topic configs ``--topic-config`` gives. ``--broker tansu`` starts the Tansu broker instead
(``globald.embedded.tansu``: the modern protocol, record timestamps and topic configs, in memory, no compaction),
which versioned tables and as-of lookups need: 0.9 records carry no timestamp. Without Tansu installed it is
refused in one line, exit 2, naming the pip command.
writes ``<dir>/globald.toml`` (state_dir ``state``, relative to that file) and prints the commands to try next.
With ``--registry`` it also serves a local Schema Registry on 127.0.0.1, in this process, with the typed page's
schema registered under ``<topic>-value`` for each ``--topic``, and writes its ``[registry]`` table into the config
(``globald.embedded.dev_registry``). With ``--export`` that config also exports to ``<dir>/exports``, and
``<dir>/globald-2.toml`` is a second daemon's (``add_second_daemon``), which bootstraps from those exports: exports
tried on one machine. With ``--run`` it also runs ``globald run`` on that config as a child process. It stays up
until Ctrl-C or SIGTERM, then stops what it started and removes ``<dir>`` (``--keep`` keeps it). A state_dir that
another globald still holds is left in place, and said so: it is that daemon's.

Nothing here is used by the daemon; it is the hands-on counterpart of ``globald demo``, which runs a fixed script.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from globald.common import exitcodes
from globald.common.errors import RefusedError, UsageError
from globald.embedded.broker import stop_process
from globald.embedded.interrupts import Interrupts

if TYPE_CHECKING:
    from globald.embedded.broker import EmbeddedKafka
    from globald.embedded.registry import LocalRegistry
    from globald.embedded.tansu import EmbeddedTansu

TOPIC = TABLE = "customers"
PARTITIONS = 3
TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")  # Kafka's rule (it becomes a directory under the broker's log.dirs)
READY_LINE = "Stop with Ctrl-C"  # the last line of the set-up: scripts (and the tutorial's test) wait for it
EXPORTS, SECOND_CONFIG, SECOND_STATE = "exports", "globald-2.toml", "state-2"  # --export's, beside globald.toml
EXPORT_INTERVAL_S = 60  # --export: the first daemon exports this often on its own, not only at `globald export`
KAFKA09, TANSU = "kafka-0.9", "tansu"  # --broker's choices
BROKER_NAMES = {KAFKA09: "Kafka 0.9", TANSU: "Tansu"}


def write_config(directory: Path, bootstrap_settings: dict[str, str], http_port: int, broker: str = KAFKA09) -> Path:
    path = directory / "globald.toml"
    kafka = "\n".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in bootstrap_settings.items())
    path.write_text(
        f"# Written by `globald dev` for its local {BROKER_NAMES[broker]} broker; every key is documented in "
        "config/globald.toml.\n"
        "# A relative state_dir resolves against this file's directory, not the working directory.\n"
        'state_dir = "state"\n'
        "commit_interval_ms = 200\n"
        "metadata_refresh_ms = 1000\n\n"
        f"[http]\nport = {http_port}\n\n"
        f"[kafka]\n{kafka}\n\n"
        f"[[tables]]\nname = {json.dumps(TABLE)}\ntopic = {json.dumps(TOPIC)}\n")
    return path


def add_second_daemon(config: Path, http_port: int) -> Path:
    """``--export``: ``config`` (as ``write_config`` wrote it) gains an ``[export]`` block to ``exports/`` beside it,
    and a copy of it is written as ``globald-2.toml``: a second daemon's, bootstrap only (``interval_s = 0``), on
    the same broker and tables, with a state_dir and an HTTP port of its own. A copy that shared either would be
    refused (the state_dir's lock, ``http.port``), which is what a newcomer copying the file by hand ran into."""
    exports = config.parent / EXPORTS
    exports.mkdir()
    uri = json.dumps(exports.resolve().as_uri())  # pyarrow takes only an absolute file:// URI
    text = config.read_text()
    second = text.replace('state_dir = "state"\n', f'state_dir = "{SECOND_STATE}"\n', 1)
    second = re.sub(r"^port = \d+$", f"port = {http_port}", second, count=1, flags=re.M)
    assert second.count(SECOND_STATE) == 1 and f"port = {http_port}\n" in second, "write_config's lines changed"
    config.write_text(f"{text}\n# Exports to a local directory; globald-2.toml bootstraps from them.\n"
                      f"[export]\nuri = {uri}\ninterval_s = {EXPORT_INTERVAL_S}\n")
    path = config.parent / SECOND_CONFIG
    path.write_text(f"{second}\n# A second daemon: starts from the newest usable export of globald.toml's daemon, "
                    f"then tails the topic.\n[export]\nuri = {uri}\ninterval_s = 0\nbootstrap = true\n")
    return path


def next_steps(config: Path, sample_key: str, run: bool) -> list[str]:
    c = str(config)
    lines = ["", "Try, in another terminal (with the project's venv active: source .venv/bin/activate):"]
    if not run:
        lines.append(f"  globald run --config {c}                 # the daemon, in the foreground")
    lines += [
        f"  globald status --config {c}",
        f"  globald get --config {c} --table {TABLE} {sample_key}",
        f"  globald dump --config {c} --table {TABLE} --format text | head -3",
        f"  globald reset --config {c} --table {TABLE} --yes      # wipe it: the daemon rebuilds it",
        "",
        f"{READY_LINE} (SIGTERM too): the broker stops and {config.parent} is removed (--keep keeps it).",
    ]
    return lines


def main(args: argparse.Namespace) -> int:
    work = Path(args.dir)
    if work.exists() and (not work.is_dir() or any(work.iterdir())):
        raise RefusedError(f"{work} exists and is not an empty directory (another `globald dev`, or one stopped "
                           "with --keep?): remove it, or pass --dir")
    if args.customers < 1:
        raise UsageError(f"--customers must be at least 1, not {args.customers}")
    for topic in args.topic:
        if not TOPIC_NAME.fullmatch(topic) or topic in (".", "..", TOPIC):
            raise UsageError(f"--topic {topic!r}: a topic name is 1 to 249 of a-z, A-Z, 0-9, '.', '_', '-' (not "
                             f"'.', '..' or {TOPIC!r}, which globald dev seeds itself)")
    topic_config(args.topic_config)  # a malformed one is refused before anything starts
    if args.broker == TANSU:
        from globald.embedded.tansu import TansuMissingError, tansu_binary

        try:
            tansu_binary()
        except TansuMissingError as e:
            raise UsageError(f"--broker tansu: {e}") from None
    # librdkafka's lines (the set-up's own clients) go through globald's filters: harmless 0.9 lines at DEBUG,
    # a repeated problem once and then counted.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    # Ctrl-C or SIGTERM stops it; a second one during the clean-up is ignored (it must not leave the broker's JVMs
    # behind), and so is any later one until the process exits (see globald.embedded.interrupts).
    interrupts = Interrupts().install()
    session = _Session(work, args)
    code = exitcodes.OK
    try:
        session.start()
        session.wait()
    except KeyboardInterrupt:
        pass
    except Exception as e:
        interrupts.cleaning_up()
        print(f"globald dev: failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        code = exitcodes.FAILED
    finally:
        interrupts.cleaning_up()
        try:
            session.close()
        finally:
            interrupts.done()
    return code


def topic_config(items: list[str]) -> dict[str, str]:
    """``--topic-config KEY=VALUE``s as a dict, refused with ``UsageError`` when one is not KEY=VALUE."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not re.fullmatch(r"[a-z0-9.]+", key) or not value:
            raise UsageError(f"--topic-config {item!r}: expected KEY=VALUE, a Kafka topic config such as "
                             "min.compaction.lag.ms=604800000")
        out[key] = value
    return out


class _Session:
    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        self.args = args
        self.created_dir = not work.exists()
        self.kafka: EmbeddedKafka | EmbeddedTansu
        if args.broker == TANSU:
            from globald.embedded.tansu import EmbeddedTansu

            self.kafka = EmbeddedTansu(work / "tansu")
        else:
            from globald.embedded.broker import EmbeddedKafka

            self.kafka = EmbeddedKafka(work / "kafka")
        self.daemon: subprocess.Popen[bytes] | None = None
        self.registry: LocalRegistry | None = None
        self.config: Path | None = None

    def say(self, text: str) -> None:
        print(text, flush=True)

    def start(self) -> None:
        from globald.embedded.admin import JavaToolsAdmin, ModernAdmin, TopicAdmin
        from globald.embedded.broker import EmbeddedKafka, free_port
        from globald.embedded.demo import customer_records

        t0 = time.monotonic()
        admin: TopicAdmin
        if isinstance(self.kafka, EmbeddedKafka):
            self.say(f"globald dev: starting a local Kafka 0.9 broker and ZooKeeper in {self.work}/kafka (127.0.0.1)")
            self.kafka.start()
            admin = JavaToolsAdmin(self.kafka.client_settings, self.kafka.zookeeper)
            where = f"Kafka {self.kafka.bootstrap} (ZooKeeper {self.kafka.zookeeper})"
        else:
            self.say(f"globald dev: starting a local Tansu broker (Kafka protocol, in memory) in {self.work}/tansu "
                     "(127.0.0.1)")
            self.kafka.start()
            admin = ModernAdmin(self.kafka.client_settings)
            where = f"Tansu {self.kafka.bootstrap}"
        configs = topic_config(self.args.topic_config)
        try:
            admin.create(TOPIC, partitions=PARTITIONS, compact=True)
            records = customer_records(self.args.customers, 2, seed=1)
            admin.produce(TOPIC, records)
            for topic in self.args.topic:
                admin.create(topic, partitions=PARTITIONS, compact=True, config=configs)
        finally:
            admin.close()
        self.config = config = write_config(self.work, self.kafka.client_settings, free_port(), self.args.broker)
        last = dict(records)  # the table a daemon will hold: the last value per key, tombstones delete
        keys = sorted(k for k, v in last.items() if k is not None and v is not None)
        self.say(f"  {where}, topic seeded in {time.monotonic() - t0:.1f}s")
        self.say(f"  topic {TOPIC}: compacted, {PARTITIONS} partitions, {len(records):,} records "
                 f"({self.args.customers:,} customers, updates and tombstones)")
        extra = "".join(f", {k}={v}" for k, v in configs.items())
        for topic in self.args.topic:
            self.say(f"  topic {topic}: compacted{extra}, {PARTITIONS} partitions, empty")
        self.say(f"  config: {config} (state_dir {self.work / 'state'})")
        if self.args.registry:  # before the second daemon's config, which copies the [registry] table too
            from globald.embedded.dev_registry import serve_for_dev

            self.registry, lines = serve_for_dev(config, self.args.topic)
            for line in lines:
                self.say(line)
        second = add_second_daemon(config, free_port()) if self.args.export else None
        if second is not None:
            self.say(f"  exports: {config} exports to {self.work / EXPORTS} (every {EXPORT_INTERVAL_S} s, or at "
                     "`globald export`)")
            self.say(f"  second daemon: {second} (state_dir {self.work / SECOND_STATE}), bootstraps from them")
        if self.args.run:
            self.daemon = subprocess.Popen([sys.executable, "-m", "globald", "run", "--config", str(config)])
            self.say(f"  daemon: globald run --config {config} (pid {self.daemon.pid}); its log follows")
        lines = next_steps(config, keys[min(42, len(keys) - 1)].decode(), self.args.run)
        if second is not None:  # before the closing lines
            lines[-2:-2] = [f"  globald export --config {config} --table {TABLE}     # export now",
                            f"  globald run --config {second}               # then a second daemon, from it"]
        for line in lines:
            self.say(line)

    def wait(self) -> None:
        while True:  # until Ctrl-C or SIGTERM (raised here by the handler main installed)
            time.sleep(0.5)
            if self.daemon is not None and self.daemon.poll() is not None:
                self.say(f"globald dev: the daemon exited with {self.daemon.returncode}; stopping")
                return

    def close(self) -> None:
        stop_process(self.daemon, timeout=60)
        if self.registry is not None:  # a thread of this process: stopped before the broker, after the daemon
            self.registry.stop()
        self.kafka.stop()
        self.say(self._remove())

    def _remove(self) -> str:
        from globald.store.statedir import lock_holder

        if self.args.keep or not self.created_dir:
            return f"globald dev: stopped; {self.work} kept"
        for state in (self.work / "state", self.work / SECOND_STATE):
            holder = lock_holder(state)
            if holder is not None:
                shutil.rmtree(self.kafka.run_dir, ignore_errors=True)
                return (f"globald dev: stopped; {state} kept: a globald (pid {holder}) still uses it, "
                        "stop it, then remove the directory")
        shutil.rmtree(self.work, ignore_errors=True)
        return f"globald dev: stopped; {self.work} removed"
