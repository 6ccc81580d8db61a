"""A stop within a second of SIGTERM, exit 0, when what the daemon waits on is held where no stop can reach it
(issue 40, after ``test_stop_bound.py``): measured as there, from the SIGTERM to the process's exit
(``DaemonProcess.timed_stop``), against the campaign's ``STOP_S``. Each case holds one part where a stop used to wait:

- **a cluster worker inside C**: a question held inside a C call, as a librdkafka call against a silent broker holds
  it (``tests.support.stuck_worker``); the stop waited up to 5 s for the worker (its own bound, before the shared one);
- **a state hook that does not return**: the table's RUNNING hook runs a command that outlives the stop, the stop's own
  events queued behind it; the stop waited up to the hook's timeout twice and a second (here past the 60 s grace:
  exit 1);
- **a bootstrap's download from silent storage** (``file://``: a file that is a FIFO nobody writes; the S3 emulator
  behind the campaign's front, silent on the file's requests): the download is held inside the storage call.

Each case shows that the hold landed before the signal (the worker's mark, the hook's line, the FIFO opened for
reading, the front's request count), and where data is claimed the store equals the oracle fold.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from globald.export.manifest import blob_name
from globald.export.target import EXPORTS_DIR, FILES_DIR
from tests.chaos import s3_faults
from tests.chaos.registry_faults import STOP_S
from tests.ci import require_module
from tests.harness import Broker, DaemonProcess, random_records
from tests.integration.test_export import FAST, _export_at, _export_conf, _exporter
from tests.integration.test_stop_bound import none_left, processes_naming
from tests.reliability.checks import check_store

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
WAIT_S = 120.0  # every wait for the daemon to reach a state: generous, a loaded 2-core machine
HELD_S = 300  # how long each hold lasts: far past any stop bound, so that only leaving it behind ends the stop quickly


def wait_until(check: Callable[[], bool], d: DaemonProcess, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert d.alive() and time.monotonic() < deadline, f"{what}: not within {WAIT_S:.0f}s\n{d.tail()}"
        time.sleep(0.05)


def stopped_in_time(d: DaemonProcess) -> float:
    rc, took = d.timed_stop(90)
    assert rc == 0 and took <= STOP_S, f"exit {rc} {took:.2f}s after SIGTERM (bound {STOP_S}s)\n{d.tail(60)}"
    return took


def test_a_stop_does_not_wait_for_a_cluster_worker_held_inside_a_client_call(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(300, keys=60, seed=41, tombstones=0.1))
    trigger = tmp_path / "stuck-worker"
    d = daemon({"cust": t}, start=False)
    d.module = "tests.support.stuck_worker"
    d.env = {"STUCK_WORKER_FILE": str(trigger), "STUCK_WORKER_S": str(HELD_S)}
    d.start()
    d.wait_running({"cust": broker.admin.end_offsets(t)}, timeout=WAIT_S)
    trigger.touch()
    wait_until(Path(f"{trigger}.in").exists, d, "the cluster worker inside the held call")
    took = stopped_in_time(d)
    assert "did not close within the stop's bound" in d.log.read_text(errors="replace"), d.tail()
    store = check_store(broker, d.state_dir, "cust", t)
    assert store.divergences == 0, f"store differs from the oracle at {store.offsets}: {store.error}"
    print(f"stopped in {took:.2f}s")


def test_a_stop_does_not_wait_for_a_state_hook_that_does_not_return(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t = topic()
    broker.admin.produce(t, random_records(100, keys=20, seed=43))
    seen = tmp_path / "hook-states"
    hook = tmp_path / "hook.sh"
    # The table's RUNNING runs a command that waits HELD_S: the stop's own events queue behind it
    hook.write_text(f'echo "$GLOBALD_TABLE:$GLOBALD_STATE" >> {seen}\n'
                    f'if [ "$GLOBALD_STATE" = RUNNING ] && [ "$GLOBALD_TABLE" = cust ]; then sleep {HELD_S}; fi\n')
    d = daemon({"cust": t}, hooks={"on_state_change": ["/bin/sh", str(hook)], "timeout_ms": 600_000})
    try:
        d.wait_running({"cust": broker.admin.end_offsets(t)}, timeout=WAIT_S)
        # the line is written just before the wait: from then on the hook command runs until killed
        wait_until(lambda: seen.exists() and "cust:RUNNING" in seen.read_text(), d, "the held hook")
        took = stopped_in_time(d)
        assert "a hook still running at the stop's bound is not waited for" in d.log.read_text(errors="replace")
        none_left(str(hook))  # killed with its process group, as at its timeout: no hook outlives the daemon
    finally:
        for pid in processes_naming(str(hook)):  # in a session of its own: never left to a later test
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
    print(f"stopped in {took:.2f}s")


def _largest_file(root: Path, export_id: str) -> str:
    """The blob name of the export's largest file (the first one a bootstrap downloads)."""
    doc = json.loads((root / "tbl" / EXPORTS_DIR / f"{export_id}.json").read_text())
    biggest = max(doc["files"], key=lambda f: int(f["size"]))
    return blob_name(biggest["sha256"], int(biggest["size"]))


@contextlib.contextmanager
def _reader_held(fifo: Path, d: DaemonProcess) -> Iterator[None]:
    """Once the daemon has ``fifo`` open for reading, a writer that never writes: the daemon's read waits inside
    the kernel. A non-blocking open for writing fails with ENXIO until a reader has it open: that is the proof."""
    fd = -1

    def opened() -> bool:
        nonlocal fd
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
            return False
        return True

    wait_until(opened, d, "the bootstrap reading the export's file")
    try:
        yield
    finally:
        os.close(fd)


@pytest.mark.long  # two daemons, an export, (s3) the emulator: ~7 s each at a load of 7, past make test's few
@pytest.mark.parametrize("storage", ["file", "s3"])
def test_a_stop_during_a_bootstraps_download_does_not_wait_for_silent_storage(
        storage: str, broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    t, root, exporter = _exporter(daemon, broker, topic, tmp_path, 3_000, 600, seed=47)
    assert isinstance(root, Path)
    export_id = _export_at(exporter, root, broker.admin.end_offsets(t))["export"]
    assert exporter.stop() == 0
    blob = _largest_file(root, export_id)
    new = tmp_path / "state-new"
    if storage == "file":
        (root / "tbl" / FILES_DIR / blob).unlink()
        os.mkfifo(root / "tbl" / FILES_DIR / blob)  # opened and read as the file, it never gives a byte
        d = daemon({"tbl": t}, snapshots=FAST, export=_export_conf(root, bootstrap_timeout_s=600), state_dir=new)
        with _reader_held(root / "tbl" / FILES_DIR / blob, d):
            took = stopped_in_time(d)
    else:
        require_module("moto.server", "test")  # the test extra, as the campaign's S3 events
        front = s3_faults.S3Front().start()
        try:
            bucket = front.new_bucket()
            s3_faults.mirror(root, front.uri(bucket, direct=True), "tbl", [export_id])
            front.fail("silent", blob)  # every request naming the file: taken, never answered
            d = daemon({"tbl": t}, start=False, snapshots=FAST,
                       export=_export_conf(front.uri(bucket), bootstrap_timeout_s=600), state_dir=new)
            d.env = dict(s3_faults.CREDENTIALS)
            d.start()
            wait_until(lambda: front.failed > 0, d, "the bootstrap asking the silent storage for the export's file")
            took = stopped_in_time(d)
        finally:
            front.stop()
    assert "the daemon is stopping" in d.log.read_text(errors="replace"), d.tail()
    assert not (new / "tables" / "tbl").exists(), "a download cut short was installed"
    print(f"{storage}: stopped in {took:.2f}s")
