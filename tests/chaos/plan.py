"""What the campaign injects, where and with which parameters: a pure function of the seed.

Every (fault kind, phase) pair is a cell of one fixed shuffled cycle; seed S with M faults takes the M cells that
start at position S·M, so consecutive seeds cover the whole matrix before any cell repeats. Each fault's
parameters come from its own ``random.Random(f"{seed}:{index}")``: fault K of seed S is the same whether the
earlier faults ran or not, which is what ``--seed S --only-fault K`` relies on.

Reload events (``globald reload`` or SIGHUP: a live key changed, a table added and dropped again, a burst of
SIGHUPs) and export events (``globald export``, then a second store bootstrapped from it) are further plans beside
the faults, each from a cycle of its own over (event, phase): ``reloads(seed, n, first)`` takes n cells from
position S·n, numbered from ``first`` (after the seed's faults), with parameters from the same
``random.Random(f"{seed}:{index}")``; ``exports`` likewise, numbered after the reloads. Kept apart so that adding
them moves no seed's faults.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.tools import ERRNOS, FIU_SITES

START, RESTORE, BULK_END, STEADY, COMMIT, PUBLISH, EXACT, STOP = (
    "start", "restore", "bulk-load end", "steady state", "commit", "snapshot publish", "exact build", "stop")
PHASES = (START, RESTORE, BULK_END, STEADY, COMMIT, PUBLISH, EXACT, STOP)

IO_ERROR, DISK_FULL, KILL, PAUSE, BROKER_PAUSE, BROKER_KILL, BROKER_RESTART, RETENTION, RECREATE, CLOCK = (
    "io-error", "disk-full", "daemon SIGKILL", "daemon SIGSTOP", "broker SIGSTOP", "broker SIGKILL",
    "broker restart", "retention past the daemon", "topic recreated", "clock step")
KINDS = (IO_ERROR, DISK_FULL, KILL, PAUSE, BROKER_PAUSE, BROKER_KILL, BROKER_RESTART, RETENTION, RECREATE, CLOCK)
# Faults that exist before a process does: at the start phase they may be in place before the daemon starts.
BEFORE_START_OK = {DISK_FULL, BROKER_PAUSE, BROKER_KILL, BROKER_RESTART, RETENTION, RECREATE, CLOCK}

RELOAD_LIVE, RELOAD_TABLE, SIGHUP_BURST = "reload live key", "reload adds and drops a table", "SIGHUP burst"
RELOAD_KINDS = (RELOAD_LIVE, RELOAD_TABLE, SIGHUP_BURST)
EXPORT = "export requested"
EXPORT_KINDS = (EXPORT,)
# The export's storage while a second daemon bootstraps from it (tests.chaos.exports): as written, a file torn
# (truncated), a file the manifest names gone, a file that never answers (a FIFO: its open blocks).
# The same on the S3 emulator (tests.chaos.s3_faults), the export copied into a bucket: intact, answered 503 Slow
# Down, never answered, a file the manifest names gone, and retention (a newer export, then retention with no grace)
# while the download stands. Then the upload: the second daemon, once bootstrapped, exports into the bucket, whose
# writes of files and manifests are answered 503, cut mid-body (a torn write), never answered, or answered 500.
S3_UPLOAD = ("s3 upload 5xx", "s3 upload cut", "s3 upload silent", "s3 upload 500")
S3_STORAGE = ("s3 intact", "s3 5xx", "s3 silent", "s3 missing file", "s3 retention", *S3_UPLOAD)
EXPORT_STORAGE = ("intact", "torn file", "missing file", "silent file", *S3_STORAGE)
# Schema Registry faults (tests.chaos.registry_faults), met by a registry-typed table while it restores, runs, or
# reloads: the double's modes (tests/support/registry.py), each a cell with each phase.
REGISTRY = "registry fault"
REGISTRY_KINDS = (REGISTRY,)
RELOADING = "reload"  # a phase of the registry events only: the fault met by a reload taking the reader schema
# Phases of the registry events only (tests.chaos.registry_faults): the table rebuilt by `globald reset`, exported by
# `globald export`, bootstrapped from an export into an empty state_dir, each with the registry in trouble.
REBUILD, EXPORTING, BOOTSTRAP = "rebuild", "export", "bootstrap"
LIFECYCLE_PHASES = (REBUILD, EXPORTING, BOOTSTRAP)
REGISTRY_PHASES = (RESTORE, STEADY, RELOADING, *LIFECYCLE_PHASES)
EXTRA_PHASES = (RELOADING, *LIFECYCLE_PHASES)  # phases beside PHASES that only events have
REGISTRY_MODES = ("silent", "503", "429", "401", "slow")
# Where a reload or an export lands: every phase whose daemon has its reload thread and goes on to apply it, or
# its loop to export (at start neither runs yet, and a stop applies and exports nothing: proves nothing).
RELOAD_PHASES = (RESTORE, BULK_END, STEADY, COMMIT, PUBLISH, EXACT)
# The keys a live reload changes, each with the values it may take (the campaign's config has the first).
LIVE_KEYS: dict[str, tuple[int, ...]] = {"commit_interval_ms": (500, 300, 800, 1200),
                                         "snapshots.interval_ms": (1000, 700, 1500, 2500),
                                         "snapshots.retain": (3, 4, 5)}
# Failure points whose failures nothing reports: RocksDB calls ftruncate only as it closes a file it preallocated,
# to trim it, and ignores the result (PosixWritableFile::Close); globald only when it takes its lock at start. A
# fault there shows only as a once-armed point that is spent (``reach.once_fired``), so it is planned only so: an
# "always" or "random" one could not be told from a fault that never met the daemon.
ONCE_ONLY_SITES = ("ftruncate",)
BULK, SMALL = "bulk", "small"  # the campaign's two tables: one restored as a bulk load, one small
CLOCK_STEPS = (-86_400, -3_600, -600, -30, 30, 600, 3_600, 86_400, 31_536_000)
_CYCLE_SEED = 20_260_508  # fixes the order of the (kind, phase) cycle; never derived from a campaign seed
_EXPORT_CYCLE_SEED = 20_261_130  # the same for the export events' phases
_REGISTRY_CYCLE_SEED = 20_261_129  # the same for the registry events' (mode, phase) cycle
_RELOAD_CYCLE_SEED = 20_261_164  # the same for the reload events' (kind, phase) cycle; seed 10 (the CI form's),
# two events: a SIGHUP burst and a table added and dropped by `globald reload`, both in cheap phases


@dataclass(frozen=True)
class Fault:
    seed: int
    index: int
    kind: str
    phase: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def table(self) -> str:
        return str(self.params.get("table", BULK))

    def describe(self) -> str:
        p = self.params
        if self.kind == IO_ERROR:
            how = p["mode"] + (f" p={p['probability']}" if p["mode"] == "random" else "")
            what = f"{self.kind} {p['site']} {p['errno']} {how} {p['duration']}s"
        elif self.kind == CLOCK:
            what = f"{self.kind} {p['step']:+d}s for {p['duration']}s"
        elif self.kind == RELOAD_LIVE:
            what = f"{self.kind} {p['key']} = {p['value']} by {p['via']}"
        elif self.kind == RELOAD_TABLE:
            what = f"{self.kind} by {p['via']}"
        elif self.kind == REGISTRY:
            what = f"registry {p['mode']}" + (f" Retry-After {p['retry_after']}s" if p["mode"] in ("503", "429")
                                              else "")
        elif self.kind == SIGHUP_BURST:
            what = f"{self.kind} of {p['count']} ({p['key']} = {p['value']})"
        elif self.kind == EXPORT:
            what = f"{self.kind}, bootstrap from it with its storage {p['storage']}" + (
                ", a reload during the download" if p["reload"] else "")
        elif "duration" in p:
            what = f"{self.kind} {p['duration']}s"
        else:
            what = self.kind
        where = self.phase + (f" ({p['when']})" if "when" in p else "")
        if (self.phase in (RESTORE, BULK_END, EXACT) or self.kind in (RETENTION, RECREATE, EXPORT)) and \
                self.kind != REGISTRY:
            where += f" on {self.table}"
        return f"{what} @ {where}"


def cycle() -> list[tuple[str, str]]:
    cells = [(k, p) for k in KINDS for p in PHASES]
    random.Random(_CYCLE_SEED).shuffle(cells)
    return cells


def params(seed: int, index: int, kind: str, phase: str) -> dict[str, Any]:
    rnd = random.Random(f"{seed}:{index}")
    out: dict[str, Any] = {"table": BULK if phase == BULK_END or rnd.random() < 0.7 else SMALL,
                           "nth": rnd.randint(1, 3), "fraction": round(rnd.uniform(0.05, 0.9), 2),
                           "delay": round(rnd.uniform(0.3, 3.0), 1), "target": round(rnd.uniform(0.3, 0.9), 2)}
    if phase == START and kind in BEFORE_START_OK:
        out["when"] = rnd.choice(("before-start", "at-open"))
    if kind == IO_ERROR:
        out.update(site=rnd.choice(sorted(FIU_SITES)), errno=rnd.choice(sorted(ERRNOS)),
                   mode=rnd.choice(("once", "always", "random")), probability=round(rnd.uniform(0.05, 0.5), 2),
                   duration=round(rnd.uniform(1.0, 6.0), 1))
        if out["site"] in ONCE_ONLY_SITES:
            out["mode"] = "once"
    elif kind == DISK_FULL:
        out["duration"] = round(rnd.uniform(2.0, 10.0), 1)
    elif kind == PAUSE:
        out["duration"] = round(rnd.uniform(1.0, 8.0), 1)
    elif kind == BROKER_PAUSE:
        out["duration"] = round(rnd.uniform(2.0, 10.0), 1)
    elif kind in (BROKER_KILL, BROKER_RESTART):
        out["duration"] = round(rnd.uniform(1.0, 6.0), 1)
    elif kind == CLOCK:
        out.update(step=rnd.choice(CLOCK_STEPS), duration=round(rnd.uniform(2.0, 6.0), 1))
    elif kind in RELOAD_KINDS:
        key = rnd.choice(sorted(LIVE_KEYS))
        out.update(key=key, value=rnd.choice(LIVE_KEYS[key][1:]), via=rnd.choice(("globald reload", "SIGHUP")),
                   count=rnd.randint(3, 8))
        if kind == SIGHUP_BURST:
            out["via"] = "SIGHUP"
    elif kind == REGISTRY:
        out.update(retry_after=rnd.choice((1, 3, 8)))
    return out


def plan(seed: int, faults: int) -> list[Fault]:
    cells = cycle()
    start = seed * faults
    out = []
    for i in range(faults):
        kind, phase = cells[(start + i) % len(cells)]
        out.append(Fault(seed, i, kind, phase, params(seed, i, kind, phase)))
    return out


def _cycle(kinds: tuple[str, ...], fixed: int) -> list[tuple[str, str]]:
    cells = [(k, p) for k in kinds for p in RELOAD_PHASES]
    random.Random(fixed).shuffle(cells)
    return cells


def reload_cycle() -> list[tuple[str, str]]:
    return _cycle(RELOAD_KINDS, _RELOAD_CYCLE_SEED)


def export_cycle() -> list[tuple[str, str]]:
    return _cycle(EXPORT_KINDS, _EXPORT_CYCLE_SEED)


def _take(cells: list[tuple[str, str]], seed: int, n: int, first: int) -> list[Fault]:
    out = []
    for i in range(n):
        kind, phase = cells[(seed * n + i) % len(cells)]
        out.append(Fault(seed, first + i, kind, phase, params(seed, first + i, kind, phase)))
    return out


def reloads(seed: int, n: int, first: int) -> list[Fault]:
    """The seed's ``n`` reload events, numbered from ``first`` (after its faults)."""
    return _take(reload_cycle(), seed, n, first)


def exports(seed: int, n: int, first: int) -> list[Fault]:
    """The seed's ``n`` export events, numbered from ``first`` (after its faults and reload events). What the storage
    does while a second daemon downloads, and whether a reload lands then, go round in turn from the same position
    as the phase: consecutive seeds meet every storage fault with and without a reload."""
    out = []
    for i, event in enumerate(_take(export_cycle(), seed, n, first)):
        at = seed * n + i
        extra = {"storage": EXPORT_STORAGE[at % len(EXPORT_STORAGE)], "reload": (at // len(EXPORT_STORAGE)) % 2 == 1}
        out.append(Fault(event.seed, event.index, event.kind, event.phase, {**event.params, **extra}))
    return out


def registry_cycle() -> list[tuple[str, str]]:
    """The first phases' cells in the order they always had (each seed's event there stays the same: the CI form's is
    seed 10's), then the lifecycle phases', shuffled apart."""
    cells = [(m, p) for m in REGISTRY_MODES for p in (RESTORE, STEADY, RELOADING)]
    random.Random(_REGISTRY_CYCLE_SEED).shuffle(cells)
    later = [(m, p) for m in REGISTRY_MODES for p in LIFECYCLE_PHASES]
    random.Random(_REGISTRY_CYCLE_SEED + 1).shuffle(later)
    return cells + later


def registry_events(seed: int, n: int, first: int) -> list[Fault]:
    """The seed's ``n`` registry events, numbered from ``first`` (after its faults, reload and export events)."""
    cells = registry_cycle()
    out = []
    for i in range(n):
        mode, phase = cells[(seed * n + i) % len(cells)]
        out.append(Fault(seed, first + i, REGISTRY, phase, {**params(seed, first + i, REGISTRY, phase), "mode": mode}))
    return out


def events(seed: int, faults: int, reload_events: int, export_events: int = 0, registry: int = 0) -> list[Fault]:
    """What one seed runs: its faults, then its reload events, its export events, its registry events."""
    return (plan(seed, faults) + reloads(seed, reload_events, faults)
            + exports(seed, export_events, faults + reload_events)
            + registry_events(seed, registry, faults + reload_events + export_events))
