"""Test harness: the broker under test and the real daemon run as a subprocess (``python -m globald run``).

The broker is the embedded Apache Kafka 0.9 unless ``GLOBALD_TEST_BOOTSTRAP`` names an external one (then
``GLOBALD_TEST_KAFKA_PROPS`` may add client properties as JSON, and ``GLOBALD_TEST_ZOOKEEPER`` selects the Java
admin tools for a pre-1.1 broker). The modern-protocol lane (tests/tansu) runs on ``start_modern_broker``'s: the
external broker when it is a modern one, else an embedded Tansu spoken to with librdkafka's defaults.
"""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from globald.embedded.broker import stop_process
from globald.embedded.oracle import Table, fold
from globald.embedded.tansu import EmbeddedTansu
from tests.support.admin import ModernAdmin, Record, TansuAdmin, TopicAdmin
from tests.support.broker import EmbeddedKafka

if TYPE_CHECKING:
    from globald.settings.config import Config

REPO = Path(__file__).resolve().parent.parent
# Client properties under which a restore lasts seconds (8 KiB per partition per fetch, 32 KiB queued), for tests
# that must act while one is under way: with librdkafka's defaults, tens of thousands of records restore faster than
# a status poll, and records fetched before a broker outage could finish the restore on their own.
SLOW_FETCH = {"fetch.message.max.bytes": 8192, "queued.max.messages.kbytes": 32}
# Between two status reads in ``wait_for``: a read is a file and a config parsed in this process (about a
# millisecond), so waiters notice a change within a commit interval without taking the daemon's CPU.
POLL_INTERVAL = 0.05


@dataclass
class Broker:
    settings: dict[str, Any]
    admin: TopicAdmin
    embedded: EmbeddedKafka | None = None
    tansu: EmbeddedTansu | None = None

    @property
    def has_timestamps(self) -> bool:
        return self.settings.get("broker.version.fallback", "") != "0.9.0.1"

    @property
    def real_offsets(self) -> bool:
        """Whether the broker's watermarks and offset-out-of-range can be trusted (not on Tansu)."""
        return self.tansu is None

    def stop(self) -> None:
        self.admin.close()
        for embedded in (self.embedded, self.tansu):
            if embedded is not None:
                embedded.stop()


def _external() -> tuple[dict[str, Any], str | None] | None:
    """The broker GLOBALD_TEST_BOOTSTRAP names: (client settings, ZooKeeper address or None), or None."""
    external = os.environ.get("GLOBALD_TEST_BOOTSTRAP")
    if not external:
        return None
    settings: dict[str, Any] = {"bootstrap.servers": external}
    settings.update(json.loads(os.environ.get("GLOBALD_TEST_KAFKA_PROPS", "{}")))
    return settings, os.environ.get("GLOBALD_TEST_ZOOKEEPER")


def start_broker(run_dir: Path) -> Broker:
    external = _external()
    if external:
        settings, zookeeper = external
        return Broker(settings, TopicAdmin.for_broker(settings, zookeeper))
    kafka = EmbeddedKafka(run_dir).start()
    return Broker(kafka.client_settings, TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper), kafka)


def start_modern_broker(run_dir: Path) -> Broker:
    """The external broker if it speaks the modern protocol (no ZooKeeper tools, no 0.9 fallback), else Tansu."""
    external = _external()
    if external:
        settings, zookeeper = external
        broker = Broker(settings, ModernAdmin(settings))
        if zookeeper is None and broker.has_timestamps:
            return broker
    tansu = EmbeddedTansu(run_dir).start()
    return Broker(tansu.client_settings, TansuAdmin(tansu.client_settings), tansu=tansu)


def random_records(n: int, keys: int, seed: int, tombstones: float = 0.05, null_keys: float = 0.0,
                   value_size: int = 24) -> list[Record]:
    rnd = random.Random(seed)
    out: list[Record] = []
    for i in range(n):
        if rnd.random() < null_keys:
            out.append((None, b"null-key-%d" % i))
            continue
        key = b"key-%06d" % rnd.randrange(keys)
        value = None if rnd.random() < tombstones else (b"v%d-" % i) + rnd.randbytes(value_size)
        out.append((key, value))
    return out


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def write_config(path: Path, state_dir: Path, settings: dict[str, Any], tables: dict[str, str],
                 **top: Any) -> Path:
    """A config file for ``tables`` on ``settings``. Its HTTP endpoint listens on a free port unless ``http`` says
    otherwise: on the default 9464, a daemon would be refused while another test's (another xdist worker's) holds it."""
    top.setdefault("http", {"port": 0})
    lines = [f"state_dir = {json.dumps(str(state_dir))}"]
    lines += [f"{k} = {toml_value(v)}" for k, v in top.items() if not isinstance(v, dict)]
    for section, values in ((k, v) for k, v in top.items() if isinstance(v, dict)):
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    lines.append("[kafka]")
    lines += [f"{json.dumps(k)} = {toml_value(v)}" for k, v in settings.items()]
    for name, topic in tables.items():
        lines += ["[[tables]]", f"name = {json.dumps(name)}", f"topic = {json.dumps(topic)}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def globald(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "globald", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@dataclass
class DaemonProcess:
    """The real daemon, run as ``python -m globald run --config FILE``."""

    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)
    env: dict[str, str] | None = None  # added to the daemon's environment
    module: str = "globald"  # what ``python -m`` runs: another build's entry point in upgrade/downgrade tests
    # The config as last loaded: a test that rewrites the file while the daemon runs (a reload test) may be caught
    # half-way, and a status read then goes on with the last config that loaded instead of failing the test.
    _last_config: Config | None = field(default=None, init=False, repr=False)

    def start(self) -> DaemonProcess:
        out = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, "run", "--config", str(self.config)],
                                     stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        out.close()
        self.pids.append(self.proc.pid)
        return self

    def _load_config(self) -> Config:
        from globald.common.errors import ConfigError
        from globald.settings.config import load

        try:
            self._last_config = load(self.config)
        except ConfigError:
            if self._last_config is None:
                raise
        return self._last_config

    @property
    def state_dir(self) -> Path:
        return self._load_config().state_dir

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any]:
        """The document ``globald status --json`` prints (the running daemon's, a starting one's, or with no daemon
        on the state_dir the offsets on disk), made in this process by the function the command prints: a
        subprocess per read cost ~0.5 s of CPU, starving the daemon waited for on a 2-core machine."""
        from globald.cli.status import answer

        return cast(dict[str, Any], json.loads(json.dumps(answer(self._load_config(), str(self.config)).doc)))

    def status_cli(self) -> dict[str, Any]:
        """``globald status --json`` run as a process: for the tests of the command itself."""
        r = globald("status", "--config", str(self.config), "--json")
        assert r.returncode in (0, 3, 5), r.stderr
        return json.loads(r.stdout)

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60.0,
                 what: str = "condition") -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        doc: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}; log:\n{self.tail()}")
            doc = self.status()
            try:
                if predicate(doc):
                    return doc
            except KeyError:  # a document from before the daemon listed its tables (starting): not yet
                pass
            time.sleep(POLL_INTERVAL)
        raise AssertionError(f"timed out waiting for {what}; last status {doc}; log:\n{self.tail()}")

    def wait_running(self, ends: dict[str, dict[int, int]] | None = None, timeout: float = 60.0) -> dict[str, Any]:
        """RUNNING and ready, and (when given) each table's offsets at least at ``ends``."""

        def ok(doc: dict[str, Any]) -> bool:
            # Ready (a snapshot of every table is published) follows RUNNING within one loop turn.
            if doc.get("state") != "RUNNING" or doc.get("pid") != self.pid or doc.get("ready") is False:
                return False
            for table, want in (ends or {}).items():
                got = doc["tables"][table]["offsets"]
                if any(got.get(str(p), -1) < o for p, o in want.items()):
                    return False
            return True

        return self.wait_for(ok, timeout, f"RUNNING at {ends}")

    def dump(self, table: str, snapshot: str | None = None) -> dict[bytes, tuple[bytes, int]]:
        args = ["dump", "--config", str(self.config), "--table", table]
        if snapshot:
            args += ["--snapshot", snapshot]
        r = globald(*args)
        assert r.returncode == 0, r.stderr
        out: dict[bytes, tuple[bytes, int]] = {}
        for line in r.stdout.splitlines():
            doc = json.loads(line)
            out[base64.b64decode(doc["key"])] = (base64.b64decode(doc["value"]), doc["timestamp"])
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        assert self.proc is not None
        proc = self.proc

        def dump_stacks() -> None:
            proc.send_signal(signal.SIGUSR2)  # the daemon prints every thread's stack into its log
            time.sleep(2)

        if not stop_process(proc, sig, timeout, before_kill=dump_stacks):
            raise AssertionError(f"daemon did not stop on {sig}; log:\n{self.tail()}")
        return self.proc.returncode

    def timed_stop(self, wait_s: float = 60.0) -> tuple[int | None, float]:
        """SIGTERM; (exit code, seconds from the signal to the exit), as the chaos campaign's "stop within a second"
        measures them. The exit code is None when the daemon had not exited within ``wait_s`` (then SIGKILLed)."""
        assert self.proc is not None
        t0 = time.monotonic()
        os.kill(self.pid, signal.SIGTERM)
        try:
            rc: int | None = self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            rc = None
            self.stop(signal.SIGKILL)
        return rc, time.monotonic() - t0

    def log_size(self) -> int:
        """The log's size now: a mark for ``log_since``, to tell what the daemon says from then on."""
        try:
            return self.log.stat().st_size
        except OSError:
            return 0

    def log_since(self, offset: int, lines: int = 40) -> str:
        """The last ``lines`` lines of the log written after ``offset`` (a ``log_size()``)."""
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


@contextmanager
def daemon_factory(broker: Broker, tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Builds DaemonProcesses for {table: topic} on ``broker``; every one still running at the end is stopped.

    ``kafka`` adds client properties to the broker's; ``state_dir`` overrides ``tmp_path/state``.
    """
    made: list[DaemonProcess] = []

    def make(tables: dict[str, str], start: bool = True, kafka: dict[str, Any] | None = None,
             state_dir: Path | None = None, **top: object) -> DaemonProcess:
        top.setdefault("commit_interval_ms", 200)
        top.setdefault("http", {"enabled": False})
        cfg = write_config(tmp_path / f"globald-{len(made)}.toml", state_dir or tmp_path / "state",
                           {**broker.settings, **(kafka or {})}, tables, **top)
        d = DaemonProcess(cfg, tmp_path / f"daemon-{len(made)}.log")
        made.append(d)
        return d.start() if start else d

    try:
        yield make
    finally:
        for d in made:
            if d.alive():
                d.stop()


def values_only(dump: dict[bytes, tuple[bytes, int]]) -> Table:
    return {k: v for k, (v, _) in dump.items()}


def oracle_at(broker: Broker, topic: str, offsets: dict[str, int]) -> Table:
    return fold(broker.settings, topic, {int(p): o for p, o in offsets.items()})


def open_store_db(path: Path) -> Any:
    """A table database opened read-write the way the daemon opens it (created empty where none is), for tests that
    damage it on purpose.

    Not with RocksDB's saved OPTIONS: a kill during a bulk load leaves a memtable kind those refuse to reopen."""
    from rocksdict import Rdict

    from globald.store import layout
    from globald.store.names import COLUMN_FAMILIES, DEFAULT_CF
    from globald.store.options import StoreOptions

    found = layout.families(path) if (path / "CURRENT").exists() else []
    families = {*COLUMN_FAMILIES, *(cf for cf in found if cf != DEFAULT_CF)}  # a typed table's
    return Rdict(str(path), StoreOptions().rocksdb(), column_families={cf: StoreOptions().rocksdb() for cf in families})


STOPPED_STATES = ("T", "t")  # stopped by a signal (SIGSTOP), or by a tracer


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (R running, S sleeping, T stopped by SIGSTOP, Z zombie…), from
    /proc/PID/stat; None once it is gone. The command name may hold spaces and parentheses: the state follows the
    last ')'."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def listening_ports(pid: int) -> set[int]:
    """The TCP ports ``pid`` listens on (IPv4), from /proc: for a daemon configured with HTTP port 0 whose port is
    needed before its status names it. A port picked free by the test and closed before the daemon binds it may be
    taken meanwhile by another xdist worker's broker, Spark or daemon."""
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports: set[int] = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports

