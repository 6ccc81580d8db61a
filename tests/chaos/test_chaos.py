"""CI form of the chaos campaign: one seed, a handful of faults, two reload events (a SIGHUP burst, a table added
and dropped by ``globald reload``), one export event (a second daemon bootstrapped from an export on the S3
emulator, whose exports then meet uploads cut mid-body) and one Schema Registry event (silent, met by a reload),
against the real daemon on its own broker.

It fails on any divergence, any PID change the campaign did not cause, any fault not recovered, any planned fault
not injected (or an I/O fault the daemon never met: ``tests.chaos.reach``; a reload it did not apply:
``tests.chaos.reloads``), any campaign error, or a probe that
shows libfiu or libfaketime not reaching the daemon. ``make chaos`` runs the long form (≥ 10 seeds, ≥ 200 faults);
``GLOBALD_CHAOS_SEED`` replays another seed here. Needs fiu-utils and faketime (``make sysdeps``), else skips (and
fails in CI).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.chaos import plan, runner, tools
from tests.chaos.campaign import Outcome
from tests.chaos.entry import SteppedClock
from tests.ci import unavailable
from tests.harness import REPO
from tests.support import registry as registry_double

SEED = int(os.environ.get("GLOBALD_CHAOS_SEED", "10"))
FAULTS = 5
RELOADS = 2  # reload events after the faults (tests/chaos/reloads.py)
EXPORTS = 1  # export events after those (tests/chaos/exports.py): seed 10's, an upload cut mid-body on the S3 emulator
REGISTRY = 1  # Schema Registry events after those (tests/chaos/registry_faults.py): seed 10's is silent @ reload


def test_a_fault_is_a_function_of_its_seed_and_index() -> None:
    assert plan.plan(3, 22) == plan.plan(3, 22)
    assert plan.plan(3, 22) != plan.plan(4, 22)
    # What --only-fault K replays: the same kind, phase and parameters as in the full run.
    fault = plan.plan(5, 22)[7]
    kind, phase = plan.cycle()[(5 * 22 + 7) % len(plan.cycle())]
    assert (fault.kind, fault.phase, fault.params) == (kind, phase, plan.params(5, 7, kind, phase))


def test_make_chaos_covers_every_kind_in_every_phase() -> None:
    """The default of ``make chaos`` (10 seeds of 22 from seed 1) injects every kind in every phase at least twice."""
    args = runner.parse([])
    cells = Counter((f.kind, f.phase) for s in range(args.seed, args.seed + args.seeds)
                    for f in plan.plan(s, args.faults_per_seed))
    assert args.seeds >= 10 and args.seeds * args.faults_per_seed >= 200
    assert set(cells) == {(k, p) for k in plan.KINDS for p in plan.PHASES}
    assert min(cells.values()) >= 2


def test_reload_events_are_a_function_of_the_seed_and_move_no_fault() -> None:
    """Reload events come after a seed's faults, from a cycle of their own: the faults of a seed are the same with
    or without them, and event K is the same whichever events ran before it (``--only-fault K``)."""
    events = plan.events(3, 22, 3)
    assert events[:22] == plan.plan(3, 22) and events == plan.events(3, 22, 3) != plan.events(4, 22, 3)
    assert [e.index for e in events[22:]] == [22, 23, 24]
    kind, phase = plan.reload_cycle()[3 * 3 + 1]
    assert (events[23].kind, events[23].phase, events[23].params) == (kind, phase, plan.params(3, 23, kind, phase))
    for e in (e for s in range(1, 30) for e in plan.reloads(s, 3, 22)):
        assert e.kind in plan.RELOAD_KINDS and e.phase in plan.RELOAD_PHASES
        assert e.params["value"] in plan.LIVE_KEYS[e.params["key"]][1:]  # never the value already in force
        assert e.kind != plan.SIGHUP_BURST or e.params["via"] == "SIGHUP"
        assert e.describe().startswith(e.kind)


def test_make_chaos_lands_every_reload_event_in_every_phase_it_can() -> None:
    """The default of ``make chaos`` asks for each reload event in each phase where it can be applied at least once,
    by ``globald reload`` and by SIGHUP; the CI form has at least one."""
    args = runner.parse([])
    events = [e for s in range(args.seed, args.seed + args.seeds)
              for e in plan.reloads(s, args.reloads_per_seed, args.faults_per_seed)]
    assert {(e.kind, e.phase) for e in events} == {(k, p) for k in plan.RELOAD_KINDS for p in plan.RELOAD_PHASES}
    assert {e.params["via"] for e in events} == {"globald reload", "SIGHUP"}
    assert plan.reloads(SEED, RELOADS, FAULTS)


def test_export_events_come_after_the_reload_events_and_cover_their_phases() -> None:
    """Export events are numbered after a seed's reload events and move none of them; ``make chaos`` asks for an
    export in every phase where one can be made."""
    events = plan.events(3, 22, 3, 2)
    assert events[:25] == plan.events(3, 22, 3) and [(e.index, e.kind) for e in events[25:]] == [
        (25, plan.EXPORT), (26, plan.EXPORT)]
    args = runner.parse([])
    phases = {e.phase for s in range(args.seed, args.seed + args.seeds)
              for e in plan.exports(s, args.exports_per_seed, args.faults_per_seed + args.reloads_per_seed)}
    assert phases == set(plan.RELOAD_PHASES)


def test_make_chaos_bootstraps_from_every_storage_fault_with_and_without_a_reload() -> None:
    """``make chaos`` bootstraps from an export under each storage fault (file://, the S3 emulator's download and
    upload), each with a reload landing during the download and without."""
    args = runner.parse([])
    events = [e for s in range(args.seed, args.seed + args.seeds)
              for e in plan.exports(s, args.exports_per_seed, args.faults_per_seed + args.reloads_per_seed)]
    assert {(e.params["storage"], e.params["reload"]) for e in events} == {
        (storage, reload) for storage in plan.EXPORT_STORAGE for reload in (False, True)}
    # The CI form meets the S3 emulator and an upload fault (~+20 s: a second daemon bootstraps, then exports).
    assert [e.params["storage"] for e in plan.exports(SEED, EXPORTS, FAULTS + RELOADS)] == ["s3 upload cut"]


def test_registry_events_come_last_and_make_chaos_has_every_fault_in_every_phase() -> None:
    """Registry events are numbered after a seed's export events and move nothing before them; ``make chaos`` meets
    each of the registry double's faults in a restore, in steady state and in a reload."""
    events = plan.events(3, 22, 3, 2, 2)
    assert events[:27] == plan.events(3, 22, 3, 2)
    assert [(e.index, e.kind) for e in events[27:]] == [(27, plan.REGISTRY), (28, plan.REGISTRY)]
    assert events[27:] == plan.registry_events(3, 2, 27)
    args = runner.parse([])
    first = args.faults_per_seed + args.reloads_per_seed + args.exports_per_seed
    cells = {(e.params["mode"], e.phase) for s in range(args.seed, args.seed + args.seeds)
             for e in plan.registry_events(s, args.registry_per_seed, first)}
    assert cells == {(m, p) for m in plan.REGISTRY_MODES for p in plan.REGISTRY_PHASES}
    assert set(plan.REGISTRY_MODES) == set(registry_double.MODES)


def test_a_reload_event_not_applied_is_not_a_landed_one() -> None:
    """A reload event counts only once the daemon applied it (``hit``, set from its config generation)."""
    event = plan.reloads(1, 1, 22)[0]
    assert not Outcome(event, reached=True, injected=True, recovered=True, hit=True).failed
    assert Outcome(event, reached=True, injected=True, recovered=True, hit=False).failed
    assert Outcome(event, reached=True, injected=True, recovered=True).failed
    assert Outcome(event, reached=False, injected=False).failed


def test_the_daemons_children_start_without_the_campaigns_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocator decides with libfiu's preload in view (``auto`` leaves a preloading process alone: without it,
    it would re-execute the daemon without libfiu); what the daemon then starts (a reload's check-config) inherits
    neither the preload nor libfiu's control variables."""
    from globald.ops import allocator
    from tests.chaos import entry

    seen: list[str | None] = []
    monkeypatch.setattr(allocator, "switch", lambda wanted: seen.append(os.environ.get("LD_PRELOAD")))
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/fiu/fiu_run_preload.so")
    monkeypatch.setenv("FIU_CTRL_FIFO", str(Path("/nonexistent/fiu")))
    entry.children_without_tools()
    allocator.switch("auto")
    assert seen == ["/usr/lib/fiu/fiu_run_preload.so"]
    assert "LD_PRELOAD" not in os.environ and "FIU_CTRL_FIFO" not in os.environ


def test_under_libfiu_pyarrow_loads_without_jemallocs_background_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """libarrow's jemalloc starts a background thread inside libarrow's dlopen; under libfiu that thread's start and
    libarrow's mimalloc init deadlock (``import pyarrow`` under ``fiu-run`` hung 13 times in 40, 0 in 40 without the
    thread). The daemon under the campaign's tools loads pyarrow without it."""
    from tests.chaos import entry

    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/fiu/fiu_run_preload.so")
    monkeypatch.delenv(entry.ARROW_JEMALLOC_CONF_ENV, raising=False)
    entry.arrow_without_background_thread()
    env = {**os.environ}
    env.pop("LD_PRELOAD")  # the setting is what is checked here, not libfiu
    threads = "import os, pyarrow, time; time.sleep(0.3); print(*(open(f'/proc/self/task/{t}/comm').read().strip() " \
              "for t in os.listdir('/proc/self/task')))"
    out = subprocess.run([sys.executable, "-c", threads], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "jemalloc_bg_thd" not in out.stdout.split()
    del env[entry.ARROW_JEMALLOC_CONF_ENV]  # and the check can fail: without the setting the thread is there
    out = subprocess.run([sys.executable, "-c", threads], env=env, capture_output=True, text=True, timeout=120)
    assert "jemalloc_bg_thd" in out.stdout.split(), out.stdout


def test_the_daemon_clock_steps_with_its_file(tmp_path: Path) -> None:
    """What a clock fault changes in the daemon: its wall clock, both ways; never the monotonic clock."""
    offset = tmp_path / "offset"
    offset.write_text("-86400\n")
    clock = SteppedClock(str(offset))
    mono = time.monotonic()
    assert abs(clock.time() - (time.time() - 86_400)) < 5
    offset.write_text("+3600\n")
    clock._next_read = 0.0  # as if the once-a-second re-read were due
    assert abs(clock.time_ns() / 1e9 - (time.time() + 3_600)) < 5
    assert time.monotonic() - mono < 5


def test_a_step_is_in_force_once_the_clock_has_read_it(tmp_path: Path) -> None:
    """What a hook armed with "clock" waits for: a read of the offset file after the daemon was resumed. Until
    then the once-a-second cache carries the old offset; the wait ends at the cache's next re-read, not later."""
    offset = tmp_path / "offset"
    offset.write_text("+0\n")
    clock = SteppedClock(str(offset))
    assert abs(clock.time() - time.time()) < 5  # read: cached for the next second
    offset.write_text("-3600\n")
    resumed = time.monotonic()
    clock._next_read = resumed + 0.2  # the cache is due in 0.2 s
    assert clock.offset_ns() == 0  # stale: a phase of milliseconds would go on at +0
    assert clock.in_force_after(resumed) == -3_600 * 1_000_000_000
    assert time.monotonic() - resumed < 0.2 + 2.0


@pytest.mark.chaos
@pytest.mark.long
@pytest.mark.kafka
@pytest.mark.timeout(420)
def test_short_seeded_campaign(tmp_path: Path) -> None:
    if os.environ.get("GLOBALD_TEST_BOOTSTRAP"):
        pytest.skip("the campaign stops, pauses and kills its broker: it needs the embedded one")
    why = tools.missing()
    if why is not None:
        print(f"chaos: not run: {why}")
        unavailable(why)
    args = runner.parse(["--seed", str(SEED), "--seeds", "1", "--faults-per-seed", str(FAULTS),
                         "--reloads-per-seed", str(RELOADS), "--exports-per-seed", str(EXPORTS),
                         "--registry-per-seed", str(REGISTRY),
                         "--recover-timeout", "120", "--report-dir", str(runner.report_dir() / "ci")])
    campaign = runner.run(args)
    report = (runner.report_dir() / "ci" / "report.md").read_text()
    assert not campaign.aborted, report
    assert campaign.probes and all(p.ok for _, p in campaign.probes), report
    # Every planned fault injected (a fault that did not happen proves nothing), and every I/O fault met by the
    # daemon (``Outcome.failed`` says so for those that were not).
    planned = FAULTS + RELOADS + EXPORTS + REGISTRY
    assert len(campaign.outcomes) == planned and all(o.injected for o in campaign.outcomes), report
    assert not [o for o in campaign.outcomes if o.failed], report


def test_a_fault_that_did_not_happen_is_not_a_recovered_one() -> None:
    """An I/O fault the daemon never met (not injected, or injected where nothing showed it), and a fault the
    campaign failed to inject, fail: a green run must mean every planned fault happened and was survived."""
    io = next(f for f in plan.plan(1, 22) if f.kind == plan.IO_ERROR)
    broker = next(f for f in plan.plan(1, 22) if f.kind == plan.BROKER_KILL)
    assert not Outcome(io, reached=True, injected=True, recovered=True, hit=True).failed
    assert Outcome(io, reached=True, injected=True, recovered=True, hit=False).failed
    assert Outcome(io, reached=False, injected=False).failed
    assert not Outcome(broker, reached=True, injected=True, recovered=True).failed
    assert Outcome(broker, campaign_errors=["TimeoutError: the admin call timed out"]).failed


ONCE_PROBE = """
import ctypes, json, os, sys
from tests.chaos.entry import probe_once
lib = ctypes.CDLL(None)
lib.fiu_enable.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]
arm, name = sys.argv[1], sys.argv[2].encode()
for probe_id, call in ((1, False), (2, True)):
    with open(arm + ".probe", "w") as f:  # before the point is armed: it may be armed on open
        f.write(json.dumps({"id": probe_id, "name": name.decode()}))
    assert lib.fiu_enable(name, 1, ctypes.c_void_p(5), 1) == 0  # EIO, once
    if call:
        try:
            os.unlink(arm + ".absent") if name.endswith(b"unlink") else os.open(arm + ".absent", os.O_RDONLY)
        except OSError:
            pass
    probe_once(arm)
# Asked with "keep": not fired, and still armed afterwards (the next call fails, then no longer).
with open(arm + ".probe", "w") as f:
    f.write(json.dumps({"id": 3, "name": name.decode(), "keep": 5}))
assert lib.fiu_enable(name, 1, ctypes.c_void_p(5), 1) == 0
probe_once(arm)
call = (lambda: os.unlink(arm + ".absent")) if name.endswith(b"unlink") else (lambda: os.open(arm + ".absent", 0))
errnos = []
for _ in range(2):
    try:
        call()
    except OSError as e:
        errnos.append(e.errno)
print(errnos)
"""


@pytest.mark.parametrize("point", ["posix/io/dir/unlink", "posix/io/oc/open"])
def test_the_once_probe_tells_a_point_that_failed_a_call_from_one_still_armed(tmp_path: Path, point: str) -> None:
    """What reach.once_fired relies on, in a real process under fiu-run: a onetime point that failed a call is no
    longer armed, one that did not still is. On ``open`` too: the probe's own read of its request must not be the
    call that spends the point (seed 10's "io-error open EIO once @ restore" went unanswered so). Asked with
    ``keep`` (the campaign asking while it waits), a point not fired yet stays armed."""
    why = tools.missing()
    if why is not None:
        unavailable(why)
    arm = tmp_path / "arm.json"
    r = subprocess.run(["fiu-run", "-x", sys.executable, "-c", ONCE_PROBE, str(arm), point], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    answers = [json.loads(arm.with_name(f"arm.json.probe-{i}").read_text()) for i in (1, 2, 3)]
    assert answers == [{"fired": False}, {"fired": True}, {"fired": False}], r.stderr
    assert r.stdout.split("\n")[0] == "[5, 2]", r.stdout  # EIO from the point kept armed, then ENOENT


CLOCK_UNDER_FIU = """
import ctypes, os, sys
from tests.chaos.entry import SteppedClock
path = sys.argv[1]
clock = SteppedClock(path)
lib = ctypes.CDLL(None)
lib.fiu_enable.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_uint]
assert lib.fiu_enable(b"posix/io/oc/open", 1, ctypes.c_void_p(5), 1) == 0  # EIO, once
offset = clock.offset_ns()
try:
    os.close(os.open(path, os.O_RDONLY))
    print(offset, "open not failed")
except OSError as e:
    print(offset, e.errno)
"""


def test_the_campaigns_own_reads_in_the_daemon_leave_an_open_fault_to_the_daemon(tmp_path: Path) -> None:
    """The daemon's clock re-reads its offset file once a second: a once-armed ``open`` point armed for the daemon
    must not be spent by that read (the campaign's own, which keeps its last value without a word), but by the
    daemon's next open. Seed 10's "io-error open EIO once @ restore" was spent so, and never met the daemon."""
    why = tools.missing()
    if why is not None:
        unavailable(why)
    offset = tmp_path / "offset"
    offset.write_text("-3600\n")
    r = subprocess.run(["fiu-run", "-x", sys.executable, "-c", CLOCK_UNDER_FIU, str(offset)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == [str(-3_600 * 1_000_000_000), str(errno.EIO)], r.stdout + r.stderr


class _Metrics:
    """A /metrics endpoint serving whatever text the test sets, and just enough of a ChaosDaemon for
    ``reach.Evidence`` (its log and RocksDB LOGs say nothing)."""

    def __init__(self, tmp_path: Path) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from threading import Thread

        self.text = ""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = owner.text.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        Thread(target=self.server.serve_forever, daemon=True).start()
        self.http_port = self.server.server_address[1]
        self.state_dir, self.pid = tmp_path, os.getpid()

    def alive(self) -> bool:
        return True

    def log_size(self) -> int:
        return 0

    def log_since(self, offset: int, lines: int = 40) -> str:
        return ""


def test_only_caught_disk_errors_count_as_a_landed_io_fault(tmp_path: Path) -> None:
    """A rise in caught exceptions shows an I/O fault landed only where nothing but the state_dir's OSErrors is
    caught: a Kafka error or a bug caught at another place meanwhile is not the fault."""
    from tests.chaos import reach

    fake = _Metrics(tmp_path)
    try:
        def metrics(status_file: int, exact_build: int) -> str:
            return (f'globald_swallowed_failures_total{{where="status_file"}} {status_file}.0\n'
                    f'globald_swallowed_failures_total{{where="exact_build"}} {exact_build}.0\n')

        fake.text = metrics(1, 1)
        evidence = reach.Evidence.before(fake, ["t"])  # type: ignore[arg-type]
        fake.text = metrics(1, 5)
        assert evidence.met(fake, []) is None  # type: ignore[arg-type]
        fake.text = metrics(2, 5)
        assert "rose from 1 to 2" in (evidence.met(fake, []) or "")  # type: ignore[arg-type]
    finally:
        fake.server.shutdown()
