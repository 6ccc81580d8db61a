"""Reload events of the campaign (``plan.RELOAD_KINDS``): the config edited and the daemon asked to read it again,
inside a phase, as an operator or a ConfigMap swap would while it restores, rebuilds, commits or publishes.

- **live key**: one of ``plan.LIVE_KEYS`` set to the event's value, asked by ``globald reload`` or SIGHUP;
- **a table added and dropped**: a third, small table on a topic of its own is added; once it is RUNNING at its
  log end its store is compared with the fold, then the file without it is reloaded the same way: dropped, its
  store deleted;
- **SIGHUP burst**: a live key changed, then ``count`` SIGHUPs in a row.

The file is written whole and swapped in (``os.replace``), never edited in place: a reload reads one version. The
daemon stands frozen at the phase's hook while the file changes and the first ask goes out (a SIGHUP is pending
until it resumes); it is resumed with its phase held, so the reload is read and checked inside the phase (the
log's ``checked`` line, for a SIGHUP: a ``globald reload`` request is picked up by the loop, which a held commit
or publish holds too). A reload that did not happen proves nothing: the event counts as landed (``Outcome.hit``)
only once ``config.generation`` in the daemon's status moved by one per reload heard, the last one ``applied``
with the sha256 of the file on disk, and a ``globald reload`` exited 0.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from globald.store.names import table_dir
from tests.chaos import exports, plan
from tests.harness import REPO, random_records, write_config
from tests.reliability.checks import check_store

if TYPE_CHECKING:
    from tests.chaos.base import SeedBase
    from tests.chaos.outcome import Outcome
    from tests.chaos.plan import Fault

EXTRA = "extra"  # the table a reload adds and drops; its topic is created once per seed, small
EXTRA_RECORDS, EXTRA_KEYS = 1_500, 500
CHECKED_S = 60.0  # a SIGHUP's reload not checked by then while its phase is held: released anyway, noted
COMMAND_CHECKED_S = 2.0  # a ``globald reload`` whose request the held loop cannot pick up: released after this
APPLIED_S = 120.0  # from the release to the generation moved
BURST_GAP_S = 0.05


def defaults() -> dict[str, int]:
    return {k: v[0] for k, v in plan.LIVE_KEYS.items()}


@dataclass
class ConfigFile:
    """The campaign's config file: the live keys and tables given, every other setting as the campaign starts."""

    path: Path
    state: Path
    settings: dict[str, Any]
    topics: dict[str, str]
    http_port: int
    export: bool = False  # with an [export] section (export events): to the seed's directory, never bootstrapping
    live: dict[str, int] = field(default_factory=defaults)  # as last written
    extra: dict[str, str] = field(default_factory=dict)

    def write(self, live: dict[str, int] | None = None, extra: dict[str, str] | None = None) -> Path:
        self.live = {**defaults(), **(live or {})}
        self.extra = dict(extra or {})
        tmp = self.path.with_name(self.path.name + ".tmp")
        write_config(tmp, self.state, self.settings, {**self.topics, **self.extra},
                     commit_interval_ms=self.live["commit_interval_ms"], metadata_refresh_ms=2000, log_level="INFO",
                     http={"enabled": True, "port": self.http_port},
                     snapshots={"interval_ms": self.live["snapshots.interval_ms"],
                                "retain": self.live["snapshots.retain"]},
                     **({"export": exports.section(self.path.parent, bootstrap=False)} if self.export else {}))
        self.amend(tmp)
        os.replace(tmp, self.path)
        return self.path

    def amend(self, path: Path) -> None:
        """What a lane adds to the file before it is swapped in (the versioned lane: each table's ``history``)."""

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def generation(doc: dict[str, Any]) -> int | None:
    g = (doc.get("config") or {}).get("generation")
    return g if isinstance(g, int) else None


class ReloadEvent:
    """One reload event of ``run`` (a ``campaign.SeedRun``): prepare before the phase is driven, ask when the daemon
    stands in it, confirm while and after it is held."""

    def __init__(self, run: SeedBase, fault: Fault, out: Outcome) -> None:
        self.run, self.f, self.out = run, fault, out
        self.d = run.daemon
        self.asks: list[subprocess.Popen[str]] = []
        self.gen0 = 0
        self.mark = 0
        self.sent = 0

    def prepare(self) -> None:
        """Before the phase: the generation in force (the daemon is settled), the extra table's topic."""
        gen = generation(self.d.status())
        if gen is None:
            raise RuntimeError("the daemon's status shows no config generation: a reload cannot be confirmed")
        self.gen0 = gen
        if self.f.kind == plan.RELOAD_TABLE:
            self.run.extra_topic()

    # -- while the daemon stands in the phase (frozen at its hook, or running in steady state) --------------------

    def inject(self) -> None:
        p = self.f.params
        self.mark = self.d.log_size()
        if self.f.kind == plan.RELOAD_TABLE:
            self.run.config.write(extra={EXTRA: self.run.extra_topic()})
        else:
            self.run.config.write(live={p["key"]: p["value"]})
        if self.f.kind != plan.SIGHUP_BURST:  # a burst is sent once the daemon runs: a stopped one merges it
            self._ask()

    def _ask(self) -> None:
        if self.f.params["via"] == "SIGHUP":
            os.kill(self.d.pid, signal.SIGHUP)
            self.sent += 1
        else:  # answers once applied or refused: waited for in confirm()
            self.asks.append(subprocess.Popen(
                [sys.executable, "-m", "globald", "reload", "--config", str(self.run.config.path)], cwd=REPO,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    # -- held, then released ----------------------------------------------------------------------------------

    def hold(self) -> None:
        """The daemon runs again, its phase held: the burst, the reload checked inside the phase, the release, the
        reload applied; for a table event, the table's life until it is dropped again."""
        out, p = self.out, self.f.params
        if self.f.kind == plan.SIGHUP_BURST:
            for _ in range(p["count"]):
                os.kill(self.d.pid, signal.SIGHUP)
                self.sent += 1
                time.sleep(BURST_GAP_S)
        wait = CHECKED_S if p["via"] == "SIGHUP" else COMMAND_CHECKED_S
        t0 = time.monotonic()
        checked = self._wait(lambda: "checked; applied at the loop's next turn" in self._log()
                             or self._gen() > self.gen0, wait)
        out.notes.append(f"reload {'checked' if checked else 'not checked yet'} {time.monotonic() - t0:.1f}s into "
                         "the held phase")
        self.run.release(out)
        if not self._applied(f"the {p['key']} = {p['value']} reload" if self.f.kind != plan.RELOAD_TABLE
                             else f"the reload adding table {EXTRA}"):
            return
        if self.f.kind == plan.RELOAD_TABLE:
            self._table_life()

    def _applied(self, what: str) -> bool:
        """Every reload heard applied: the generation moved by as many, the file on disk in force, each
        ``globald reload`` answered 0. Sets ``out.hit``."""
        out = self.out
        ok = self._wait(lambda: (n := self._heard()) > 0 and self._gen() >= self.gen0 + n, APPLIED_S)
        heard = self._heard()
        doc = self.d.status()
        gen, cfg = generation(doc), doc.get("config") or {}
        last = cfg.get("last_reload") or {}
        for ask in self.asks:
            try:
                text, rc = ask.communicate(timeout=APPLIED_S)[0], ask.returncode
            except subprocess.TimeoutExpired:
                ask.kill()
                text, rc = ask.communicate()[0], None
            if rc != 0:
                out.problems.append(f"globald reload exited {rc}: {text.strip()[-300:]}")
        self.asks = []
        problem = None
        if not ok or gen is None:
            problem = f"{what} was not applied within {APPLIED_S:.0f}s: generation {gen}, {heard} reloads heard " \
                      f"since generation {self.gen0}; last reload {last}"
        elif last.get("result") != "applied":
            problem = f"{what}: the last reload was {last.get('result')}: {last.get('error')}"
        elif cfg.get("sha256") != self.run.config.sha256():
            problem = f"{what}: the daemon's config sha256 is not the file's on disk"
        if problem:
            out.problems.append(problem)
            out.hit = False
            return False
        out.notes.append(f"{what} applied: generation {self.gen0} -> {gen} ({self.sent} SIGHUPs sent, "
                         f"{heard} reloads heard), same PID {doc.get('pid')}")
        assert gen is not None
        out.hit = out.hit is not False
        self.gen0 = gen
        return True

    def _heard(self) -> int:
        """Reloads the daemon took since the mark: SIGHUPs it logged, ``globald reload`` requests it was sent."""
        return self._log().count("SIGHUP received; reading the config again") + len(self.asks)

    def _table_life(self) -> None:
        """The added table restores to its log end and equals the fold; dropped again, its store is gone."""
        out, run = self.out, self.run
        topic = run.extra_topic()
        ends = run.admin.end_offsets(topic)

        def at_end() -> bool:
            t = (self.d.status().get("tables") or {}).get(EXTRA) or {}
            return t.get("state") == "RUNNING" and all(t.get("offsets", {}).get(str(q), 0) == o
                                                        for q, o in ends.items())

        if not self._wait(at_end, APPLIED_S):
            out.problems.append(f"table {EXTRA}, added by a reload, not RUNNING at its log end {ends} within "
                                f"{APPLIED_S:.0f}s: {(self.d.status().get('tables') or {}).get(EXTRA)}")
        else:
            store = check_store(run.broker, self.d.state_dir, EXTRA, topic, allow_uncompared=True)
            out.checks += 1
            if store.divergences or not store.compared:
                out.divergences += max(1, store.divergences)
                out.problems.append(f"table {EXTRA}, added by a reload: store differs from the oracle at "
                                    f"{store.offsets}: {store.error}")
        self.mark, self.sent = self.d.log_size(), 0
        run.config.write(live=None, extra=None)  # dropped: the campaign's own two tables again
        self._ask()
        if not self._applied(f"the reload dropping table {EXTRA}"):
            return
        if EXTRA in (self.d.status().get("tables") or {}):
            out.problems.append(f"table {EXTRA}, dropped by an applied reload, is still in the status")
        if not self._wait(lambda: not table_dir(self.d.state_dir, EXTRA).exists(), 60):
            out.problems.append(f"table {EXTRA}, dropped by a reload, still has its store directory")

    # -- helpers ------------------------------------------------------------------------------------------------

    def _gen(self) -> int:
        doc = self.d.status()
        return (generation(doc) or 0) if doc.get("pid") == self.d.pid else 0

    def _log(self) -> str:
        try:
            with open(self.d.log, "rb") as f:
                f.seek(self.mark)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def _wait(self, pred: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.d.alive():
            if pred():
                return True
            time.sleep(0.2)
        return False

    def close(self) -> None:
        """A campaign step failed halfway: no ``globald reload`` left running."""
        for ask in self.asks:
            if ask.poll() is None:
                ask.kill()
            ask.communicate()
        self.asks = []


def create_extra(run: SeedBase, topic: str, partitions: int) -> None:
    run.admin.create(topic, partitions=partitions)
    run.admin.produce(topic, random_records(EXTRA_RECORDS, keys=EXTRA_KEYS, seed=run.seed * 100 + 7))
