"""Live reconfiguration (issue 35 item 2): ``globald reload``, SIGHUP and a ConfigMap-style symlink swap, against
the real daemon and broker. The same process throughout; the table stays RUNNING and equals the fold of its topic;
a refused reload leaves the config in force untouched, says why in one line (exit 2) and shows in status."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from globald.common import exitcodes
from tests.harness import Broker, DaemonProcess, globald, oracle_at, random_records, values_only, write_config

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edit(path: Path, pattern: str, replacement: str) -> None:
    """Change one line of the config in place (as an operator's editor would, no rename)."""
    text = path.read_text()
    new = re.sub(pattern, replacement, text, count=1, flags=re.M)
    assert new != text, pattern
    with open(path, "r+") as f:
        f.write(new)
        f.truncate()


class Background:
    """``step`` again and again on a thread of its own, ``every`` seconds apart, while the ``with`` block runs. A
    sampler that dies or never samples proves nothing: its error is raised again at the end of the block, and it
    must have made at least ``min_steps`` steps."""

    every = 0.2
    min_steps = 3

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.steps = 0
        self.error: BaseException | None = None

    def step(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.step()
                self.steps += 1
                self._stop.wait(self.every)
        except BaseException as e:  # raised again on the test's thread by __exit__
            self.error = e

    def __enter__(self) -> Any:
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(60)
        if exc_type is not None:
            return  # the block's own failure says more
        assert not self._thread.is_alive(), f"{type(self).__name__}: a step did not end within 60 s"
        if self.error is not None:
            raise AssertionError(f"{type(self).__name__} died after {self.steps} steps") from self.error
        assert self.steps >= self.min_steps, f"{type(self).__name__} made {self.steps} steps, fewer than " \
                                             f"{self.min_steps}: it watched nothing"


class StateWatch(Background):
    """Every table state the status shows while the test runs."""

    def __init__(self, d: DaemonProcess) -> None:
        super().__init__()
        self.d, self.seen, self.pids = d, [], set()

    def step(self) -> None:
        doc = self.d.status()
        self.pids.add(doc.get("pid"))
        self.seen.append({n: t["state"] for n, t in doc["tables"].items()})


def reload(d: DaemonProcess, *extra: str, config: Path | None = None) -> Any:
    return globald("reload", "--config", str(config or d.config), *extra, timeout=300)


@pytest.mark.long  # five reloads, each a check-config in a child process, and three catch-ups: ~55 s
def test_reload_applies_live_settings_refuses_the_rest_and_keeps_serving(broker: Broker, topic: Callable[..., str],
                                                                          daemon: Daemon) -> None:
    t = topic()
    broker.admin.produce(t, random_records(3_000, keys=600, seed=350))
    edited = daemon({"tbl": t})
    pid = edited.pid
    # Status, dumps and waits read a copy of the first config: the one edited here is invalid at times, on purpose.
    copy = edited.config.with_name("status.toml")
    copy.write_bytes(edited.config.read_bytes())
    d = DaemonProcess(copy, edited.log, proc=edited.proc)
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)})
    assert doc["config"]["generation"] == 1 and doc["config"]["sha256"] == sha256(copy)
    assert doc["config"]["last_reload"] is None

    with StateWatch(d) as watch:
        # Live: a tunable, a [snapshots] key and a [kafka] property (the consumer is replaced), edited in place.
        edit(edited.config, r"^commit_interval_ms = .*$", "commit_interval_ms = 300")
        edit(edited.config, r"^\[kafka\]$", '[snapshots]\nretain = 5\n[kafka]\n"client.id" = "reloaded"')
        broker.admin.produce(t, random_records(1_000, keys=600, seed=351))
        r = reload(edited)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        assert "applied, config generation 2" in r.stdout
        doc = d.status()
        assert doc["config"]["generation"] == 2 and doc["config"]["sha256"] == sha256(edited.config)
        assert doc["config"]["last_reload"]["result"] == "applied"
        assert "kafka.client.id, commit_interval_ms, snapshots.retain" in d.tail(200)

        # The new consumer carries on: records produced after the reload reach the store.
        broker.admin.produce(t, random_records(1_000, keys=600, seed=352))
        ends = broker.admin.end_offsets(t)
        d.wait_running({"tbl": ends}, timeout=120)

        # Refused: a value check-config rejects. One line naming the key; nothing changes.
        applied_sha = sha256(edited.config)
        edit(edited.config, r"^commit_interval_ms = .*$", "commit_interval_ms = 5")
        r = reload(edited)
        assert r.returncode == exitcodes.USAGE, f"{r.stdout}{r.stderr}"
        assert r.stderr.count("\n") == 1 and "commit_interval_ms" in r.stderr, r.stderr
        doc = d.status()
        assert doc["config"]["generation"] == 2 and doc["config"]["sha256"] == applied_sha
        assert doc["config"]["last_reload"]["result"] == "refused"
        assert "commit_interval_ms" in doc["config"]["last_reload"]["error"]
        assert "refused, the config in force is unchanged" in d.tail(50)

        # Refused: a key that cannot change live, named alone, though another key in the file could.
        edit(edited.config, r"^commit_interval_ms = .*$", "commit_interval_ms = 400")
        edit(edited.config, r"^\[kafka\]$", "[store]\nblock_cache_mb = 8\n[kafka]")
        r = reload(edited)
        assert r.returncode == exitcodes.USAGE and "store.block_cache_mb: cannot change while the daemon runs" \
            in r.stderr, r.stderr
        assert d.status()["config"]["generation"] == 2

        # state_dir: the file names a state_dir no daemon runs on; the daemon asked anyway refuses it.
        edit(edited.config, r"^\[store\]\nblock_cache_mb = 8\n", "")
        state_dir = d.state_dir
        edit(edited.config, r"^state_dir = .*$", f'state_dir = "{state_dir}-elsewhere"')
        r = reload(edited)
        assert r.returncode == exitcodes.FAILED and "no globald runs on state_dir" in r.stderr, r.stderr
        r = reload(edited, "--state-dir", str(state_dir))
        assert r.returncode == exitcodes.USAGE and "reload refused: state_dir: cannot change" in r.stderr, r.stderr
        assert d.status()["config"]["generation"] == 2

        # SIGHUP: the daemon reads the path it was started with again; never a stop.
        edit(edited.config, r"^state_dir = .*$", f'state_dir = "{state_dir}"')
        os.kill(pid, signal.SIGHUP)
        doc = d.wait_for(lambda s: s["config"]["generation"] == 3, timeout=120, what="the SIGHUP's reload")
        assert doc["config"]["sha256"] == sha256(edited.config) and doc["config"]["last_reload"]["result"] == "applied"

        broker.admin.produce(t, random_records(500, keys=600, seed=353))
        ends = broker.admin.end_offsets(t)
        doc = d.wait_running({"tbl": ends}, timeout=120)

    assert d.alive() and watch.pids == {pid}
    assert all(states == {"tbl": "RUNNING"} for states in watch.seen), watch.seen
    offsets = doc["tables"]["tbl"]["offsets"]
    assert values_only(d.dump("tbl")) == oracle_at(broker, t, offsets)


def test_a_configmap_symlink_swap_is_followed(broker: Broker, topic: Callable[..., str], tmp_path: Path) -> None:
    """As Kubernetes updates a mounted ConfigMap: the file is a symlink into a versioned directory, replaced by one
    rename. The daemon opens the path it was given again, so it reads the new version, by SIGHUP or by reload."""
    t = topic()
    broker.admin.produce(t, random_records(1_000, keys=300, seed=360))
    state = tmp_path / "state"
    versions = [tmp_path / f"..v{i}" for i in (1, 2, 3)]
    for i, v in enumerate(versions):
        v.mkdir()
        write_config(v / "globald.toml", state, broker.settings, {"tbl": t}, commit_interval_ms=200 + i,
                     http={"enabled": False})
    live = tmp_path / "globald.toml"

    def swap(to: Path) -> None:
        tmp = tmp_path / "..tmp"
        tmp.symlink_to(to / "globald.toml")
        os.replace(tmp, live)  # atomic: a reader sees the old file or the new one

    swap(versions[0])
    d = DaemonProcess(live, tmp_path / "daemon.log").start()
    try:
        pid = d.pid
        d.wait_running({"tbl": broker.admin.end_offsets(t)})
        swap(versions[1])
        os.kill(pid, signal.SIGHUP)
        doc = d.wait_for(lambda s: s["config"]["generation"] == 2, timeout=120, what="the swap's reload")
        assert doc["config"]["sha256"] == sha256(versions[1] / "globald.toml")
        assert doc["config"]["path"] == str(live)  # the path as given, never the version it pointed to
        swap(versions[2])
        r = globald("reload", "--config", str(live), timeout=300)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        doc = d.status()
        assert doc["config"]["generation"] == 3 and doc["config"]["sha256"] == sha256(versions[2] / "globald.toml")
        assert doc["pid"] == pid and d.alive()
    finally:
        d.stop()


def test_a_reload_while_the_table_restores_gives_it_the_cluster(broker: Broker, topic: Callable[..., str],
                                                                daemon: Daemon) -> None:
    """Started with a [kafka] address nothing answers on, the table stays RESTORING; a reload with the right one
    replaces the consumer and the cluster worker's clients, and the same process restores it to the fold."""
    t = topic()
    broker.admin.produce(t, random_records(2_000, keys=400, seed=370))
    d = daemon({"tbl": t}, kafka={"bootstrap.servers": "127.0.0.1:9"})
    pid = d.pid
    d.wait_for(lambda s: s["tables"]["tbl"]["state"] == "RESTORING" and s["tables"]["tbl"]["last_error"],
               timeout=120, what="the table restoring, unable to reach the cluster")
    edit(d.config, r'^"bootstrap.servers" = "127.0.0.1:9"$',
         f'"bootstrap.servers" = "{broker.settings["bootstrap.servers"]}"')
    r = reload(d)
    assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
    broker.admin.produce(t, random_records(500, keys=400, seed=371))
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)
    assert doc["pid"] == pid and doc["config"]["generation"] == 2
    assert values_only(d.dump("tbl")) == oracle_at(broker, t, doc["tables"]["tbl"]["offsets"])


@pytest.mark.long  # a topic recreated and a table rebuilt: ~30 s
def test_a_reload_during_a_kip406_rebuild(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                          tmp_path: Path) -> None:
    """The topic is recreated under the table (a KIP-406 rebuild, ``topic_recreated``); the daemon's loop is held
    at the end of the rebuild's first partition (``tests.midway``'s hooks) while a SIGHUP asks for a reload: it is
    read and checked meanwhile, on its own thread, and applied once the loop turns again; the rebuilt table equals
    the new topic's fold, in the same process."""
    from tests import midway
    from tests.reliability.test_recreated_topic import FETCH_WAIT_MS, frozen, replace_topic

    t = topic()
    broker.admin.produce(t, random_records(3_000, keys=300, seed=380))
    d = daemon({"tbl": t}, start=False, metadata_refresh_ms=500, kafka={"fetch.wait.max.ms": FETCH_WAIT_MS})
    arm = tmp_path / "arm.json"
    midway.arm(d, arm)
    d.start()
    pid = d.pid
    d.wait_running({"tbl": broker.admin.end_offsets(t)}, timeout=120)
    tmp = arm.with_name("arm.tmp")  # hold the loop at the end of the next restore of tbl: the rebuild's
    tmp.write_text('{"id": 1, "phase": "restore", "action": "hold", "hold": true, "table": "tbl", "nth": 1}')
    tmp.replace(arm)
    with frozen(pid):  # else the daemon may see the new topic empty, rebuild with nothing to restore, and never hold
        replace_topic(broker, t, seed=381)
    held = arm.with_name(f"{arm.name}.held-1")
    deadline = time.monotonic() + 120
    while not held.is_dir():
        assert time.monotonic() < deadline and d.alive(), f"the rebuild was never held; log:\n{d.tail()}"
        time.sleep(0.1)
    edit(d.config, r"^\[kafka\]$", '[kafka]\n"client.id" = "during-the-rebuild"')
    os.kill(pid, signal.SIGHUP)
    while "checked; applied at the loop's next turn" not in d.log.read_text():
        assert time.monotonic() < deadline + 60, f"the reload was not checked while the loop was held:\n{d.tail()}"
        time.sleep(0.1)
    assert "config generation 2" not in d.log.read_text()  # the loop, held, has not applied it yet
    arm.with_name(f"{arm.name}.release-1").mkdir()
    ends = broker.admin.end_offsets(t)
    doc = d.wait_for(lambda s: s["config"]["generation"] == 2 and s["state"] == "RUNNING"
                     and s["tables"]["tbl"]["wipes"] >= 1
                     and all(s["tables"]["tbl"]["offsets"].get(str(p)) == o for p, o in ends.items()),
                     timeout=120, what="the reload applied and the table rebuilt")
    assert doc["pid"] == pid and "WIPE (" in d.log.read_text()
    assert values_only(d.dump("tbl")) == oracle_at(broker, t, doc["tables"]["tbl"]["offsets"])


class Producer(Background):
    """200 records into each topic every 0.3 s: the load the reloads happen under."""

    every = 0.3

    def __init__(self, broker: Broker, topics: list[str], seed: int) -> None:
        super().__init__()
        self.broker, self.topics, self.seed = broker, topics, seed

    def step(self) -> None:
        for t in self.topics:
            self.broker.admin.produce(t, random_records(200, keys=400, seed=self.seed))
            self.seed += 1


@pytest.mark.long  # two tables under load, three reloads, a restore of each added table: ~60 s
def test_add_drop_and_re_add_a_table_under_load(broker: Broker, topic: Callable[..., str], daemon: Daemon,
                                                tmp_path: Path) -> None:
    from globald.snapshot import leases
    from globald.snapshot.reader import current_id
    from globald.store.names import SNAPSHOT_DROPPED_PREFIX, snapshots_dir, table_dir

    a, b = topic(), topic()
    broker.admin.produce(a, random_records(2_000, keys=400, seed=390))
    broker.admin.produce(b, random_records(2_000, keys=400, seed=391))
    events = tmp_path / "events.txt"
    hook = ["sh", "-c", f'echo "$GLOBALD_TABLE $GLOBALD_STATE $GLOBALD_REASON" >> {events}']
    d = daemon({"A": a}, hooks={"on_state_change": hook})
    pid = d.pid
    d.wait_running({"A": broker.admin.end_offsets(a)})
    one_table = d.config.read_text()
    state = d.state_dir
    with Producer(broker, [a, b], seed=400), StateWatch(d) as watch:
        d.config.write_text(one_table + f'[[tables]]\nname = "B"\ntopic = "{b}"\n')
        r = reload(d)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        d.wait_for(lambda s: s["tables"]["B"]["state"] == "RUNNING" and s["tables"]["B"]["snapshot"]["current"],
                   timeout=120, what="B added, RUNNING and published")
        old = current_id(state, "B")
        assert old is not None
        leases.take(snapshots_dir(state, "B"), "a-spark-job", old, ttl_s=600)  # a reader still on B's version

        d.config.write_text(one_table)  # drop B
        r = reload(d)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        doc = d.status()
        assert set(doc["tables"]) == {"A"} and not table_dir(state, "B").exists()
        assert (snapshots_dir(state, "B") / old).is_dir()  # leased: kept for its reader

        d.config.write_text(one_table + f'[[tables]]\nname = "B"\ntopic = "{b}"\n')  # and back
        r = reload(d)
        assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
        aside = [p for p in (state / "snapshots").iterdir() if p.name.startswith(f"{SNAPSHOT_DROPPED_PREFIX}B-")]
        assert len(aside) == 1 and (aside[0] / old).is_dir(), aside  # the old files, out of the new B's way
        doc = d.wait_for(lambda s: s["tables"]["B"]["state"] == "RUNNING" and s["tables"]["B"]["snapshot"]["current"],
                         timeout=120, what="B added again, RUNNING and published")
        assert old not in {p.name for p in snapshots_dir(state, "B").iterdir()}
        leases.release(aside[0], "a-spark-job")
        d.wait_for(lambda s: not aside[0].exists(), timeout=60, what="the dropped B's snapshots deleted once released")
    ends = {"A": broker.admin.end_offsets(a), "B": broker.admin.end_offsets(b)}
    doc = d.wait_running(ends, timeout=120)
    assert doc["pid"] == pid and doc["config"]["generation"] == 4 and watch.pids == {pid}
    assert all(states.get("A") == "RUNNING" for states in watch.seen), watch.seen
    for name, t in (("A", a), ("B", b)):
        assert values_only(d.dump(name)) == oracle_at(broker, t, doc["tables"][name]["offsets"]), name
    seen = events.read_text()
    assert "B RESTORING added by a reload" in seen and "B NOT_RUNNING dropped by a reload" in seen, seen


def sighup_ignored(pid: int) -> bool:
    """The kernel's word: SIGHUP (signal 1, bit 0 of the mask) is ignored by ``pid`` now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & 1)
    return False


def test_sighup_from_the_first_moment_never_ends_the_daemon(broker: Broker, topic: Callable[..., str],
                                                            daemon: Daemon) -> None:
    """SIGHUP's default action ends a process: ``run`` ignores it from its first line (kept across the allocator's
    re-exec) until the daemon's relay hears it. SIGHUPs sent from that moment on (before it, the interpreter is
    still starting: systemd queues a reload until the start is done), through the whole start, leave it running;
    those the relay heard were reloads."""
    t = topic()
    broker.admin.produce(t, random_records(500, keys=100, seed=410))
    d = daemon({"tbl": t}, start=False)
    d.start()
    deadline = time.monotonic() + 120
    while not sighup_ignored(d.pid):
        assert d.alive() and time.monotonic() < deadline, d.tail()
        time.sleep(0.005)
    while not (d.state_dir / "status.json").exists() or d.status().get("state") != "RUNNING":
        assert d.alive(), f"a SIGHUP ended the daemon: exit {d.proc.returncode if d.proc else None}\n{d.tail()}"
        assert time.monotonic() < deadline, d.tail()
        os.kill(d.pid, signal.SIGHUP)
        time.sleep(0.05)
    os.kill(d.pid, signal.SIGHUP)
    doc = d.wait_for(lambda s: s["config"]["generation"] >= 2, timeout=120, what="a SIGHUP's reload applied")
    assert d.alive() and doc["pid"] == d.pid and doc["config"]["last_reload"]["result"] == "applied"


def test_the_http_listener_moves_live_and_an_address_in_use_is_refused(broker: Broker, topic: Callable[..., str],
                                                                        daemon: Daemon) -> None:
    """[http] port changed: a new listener is bound first, then the old one stops; /metrics on the new one shows
    the reload. A port another socket holds cannot be bound: refused in one line naming http.port, the listener
    in place serves on."""
    import socket
    import urllib.error
    import urllib.request

    def metrics(port: int) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:  # a loaded daemon's answer
            return str(r.read().decode())

    def refused(port: int) -> bool:
        """Nothing listens on ``port`` any more. A listener being stopped resets a request instead: not yet."""
        try:
            metrics(port)
        except urllib.error.URLError:
            return True
        except ConnectionError:
            pass
        return False

    t = topic()
    broker.admin.produce(t, random_records(300, keys=100, seed=420))
    d = daemon({"tbl": t}, http={"port": 0})
    doc = d.wait_running({"tbl": broker.admin.end_offsets(t)})
    first = doc["http"]["port"]
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    edit(d.config, r"^port = 0$", f"port = {port}")
    r = reload(d)
    assert r.returncode == exitcodes.OK, f"{r.stdout}{r.stderr}\n{d.tail()}"
    assert d.status()["http"]["port"] == port
    assert "globald_config_generation 2.0" in metrics(port)
    assert 'globald_config_last_reload_result{result="applied"} 1.0' in metrics(port)
    # The old listener stops after the reload is answered (on the reload thread, up to its 0.5 s poll): until then
    # a request to it is reset, then refused. Waited for with CI's generous bound, not 10 s: the stop is the
    # daemon's work on a thread of its own, which a loaded 2-core machine may not run for seconds.
    deadline = time.monotonic() + 120
    while not refused(first):
        assert time.monotonic() < deadline and d.alive(), f"the old listener still serves 120 s after the reload " \
                                                          f"was applied:\n{d.tail()}"
        time.sleep(0.05)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        edit(d.config, rf"^port = {port}$", f"port = {taken.getsockname()[1]}")
        r = reload(d)
    assert r.returncode == exitcodes.USAGE and "http.port: cannot listen on" in r.stderr, r.stderr
    assert 'globald_config_last_reload_result{result="refused"} 1.0' in metrics(port)
    assert d.status()["config"]["generation"] == 2 and d.status()["http"]["port"] == port


def test_reload_on_change_follows_a_swap_and_tries_refused_bytes_once(broker: Broker, topic: Callable[..., str],
                                                                       tmp_path: Path) -> None:
    """``reload_on_change_ms``: no signal, no command; each ConfigMap-style swap is read within the interval. A
    version check-config refuses is refused once, not at every check, and the next good one is applied."""
    t = topic()
    broker.admin.produce(t, random_records(300, keys=100, seed=430))
    versions = []
    for i, commit in enumerate((200, 300, 5, 400)):  # the third is out of bounds
        v = tmp_path / f"..v{i}"
        v.mkdir()
        versions.append(write_config(v / "globald.toml", tmp_path / "state", broker.settings, {"tbl": t},
                                     commit_interval_ms=commit, reload_on_change_ms=200, http={"enabled": False}))
    live = tmp_path / "globald.toml"

    def swap(to: Path) -> None:
        tmp = tmp_path / "..tmp"
        tmp.symlink_to(to)
        os.replace(tmp, live)

    swap(versions[0])
    d = DaemonProcess(live, tmp_path / "daemon.log").start()
    try:
        d.wait_running({"tbl": broker.admin.end_offsets(t)})
        status = DaemonProcess(versions[0], d.log, proc=d.proc)  # reads a valid file whatever live points at
        swap(versions[1])
        status.wait_for(lambda s: s["config"]["generation"] == 2, timeout=60, what="the swap seen without a signal")
        swap(versions[2])
        doc = status.wait_for(lambda s: (s["config"]["last_reload"] or {}).get("result") == "refused", timeout=60,
                              what="the bad version refused")
        assert "commit_interval_ms" in doc["config"]["last_reload"]["error"] and doc["config"]["generation"] == 2
        # Held for 15 watch periods (reload_on_change_ms = 200): a daemon that tried the same refused bytes at every
        # check would say so again meanwhile (issue 40 item 5.3: swapped away within 0.2-0.7 s, it could not tell).
        time.sleep(15 * 0.2)
        assert d.log.read_text().count("refused, the config in force is unchanged") == 1, d.tail()
        swap(versions[3])
        doc = status.wait_for(lambda s: s["config"]["generation"] == 3, timeout=60, what="the next good version")
        assert doc["config"]["sha256"] == sha256(versions[3]) and doc["pid"] == d.pid
        assert d.log.read_text().count("refused, the config in force is unchanged") == 1, d.tail()
    finally:
        d.stop()
