"""Bootstrap after a wipe while the daemon runs (``engine.refill``'s source): a table a KIP-406 wipe (an invalid
offset, a recreated topic) or a corrupt store emptied starts again from the newest usable export, as a new host
does (``export.bootstrap``), instead of replaying its whole topic.

Each refill runs ``Bootstrap`` on a worker thread of its own, with the same checks and the same bound
(``bootstrap_timeout_s``), up to a checked stage (``Staged``): the loop, which owns the store, moves it into place.
An operator's `globald reset` is not refilled (its purpose is a replay of the topic), nor is a store found empty
at start by a start that already looked for an export. Each answer becomes the table's ``origin`` in status.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable

from globald.engine.events import EMPTY_STORE, OPERATOR_RESET
from globald.engine.refill import Refilled
from globald.export.bootstrap import Origin, Staged, staging_dir
from globald.export.startup import BootstrapWorker
from globald.export.target import masked
from globald.settings.ref import ConfigRef

log = logging.getLogger(__name__)


class _Out:
    def __init__(self, worker: BootstrapWorker, install: Staged, stop: threading.Event, kind: str,
                 generation: int) -> None:
        self.worker, self.install, self.stop, self.kind = worker, install, stop, kind
        self.generation = generation  # of the config its clients are made from
        self.started = time.monotonic()


class ExportRefills:
    """``engine.refill.Refills`` from the export storage. ``record(table, origin)`` tells status where the table's
    store came from; ``looked_at_start(table)`` whether this run's start already looked for an export for it."""

    def __init__(self, config: ConfigRef, record: Callable[[str, Origin], None],
                 looked_at_start: Callable[[str], bool]) -> None:
        now = config.now
        assert now.export is not None
        self._config = config  # each bootstrap asks Kafka with the [kafka] settings in force when it begins
        self.state_dir = now.state_dir  # state_dir and [export] need a restart
        self.export = now.export
        self._record = record
        self._looked_at_start = looked_at_start
        self._out: dict[str, _Out] = {}

    @property
    def generation(self) -> int | None:
        """The oldest generation of the config a bootstrap under way made its clients from; None when none runs
        (each makes its own from the config in force when it begins)."""
        return min((out.generation for out in self._out.values()), default=None)

    def begin(self, table: str, kind: str) -> bool:
        uri = masked(self.export.uri)
        # The table as the config in force declares it: a table a reload added, or replaced, is refilled as any
        # other (its empty store is ``EMPTY_STORE``), a versioned one from an export carrying history under its
        # window, which keeps the export's since (``export.bootstrap``); one dropped meanwhile is not
        config = self._config.now
        tc = next((t for t in config.tables if t.name == table), None)
        if kind == OPERATOR_RESET or (kind == EMPTY_STORE and self._looked_at_start(table)) or tc is None:
            return False
        previous = self._out.get(table)
        if previous is not None and previous.worker.is_alive():  # given up, still unwinding: its stage is in use
            self._record(table, Origin("topic", fallback=f"wiped ({kind}) while a bootstrap of it was still "
                                                         "unwinding: restored from the topic", uri=uri))
            return False
        stop, install = threading.Event(), Staged()
        worker = BootstrapWorker(config, tc, stop, install)
        # On the loop thread, where a reload is applied too: the generation of ``config`` read above
        self._out[table] = _Out(worker, install, stop, kind, self._config.generation)
        log.info("table %s: emptied (%s); looking for an export in %s", table, kind, uri)
        self._record(table, Origin("topic", fallback=f"emptied ({kind}): looking for an export", uri=uri))
        worker.start()
        return True

    def result(self, table: str) -> Refilled | None:
        out = self._out[table]
        if out.worker.is_alive():
            if time.monotonic() - out.started < self.export.bootstrap_timeout_s or not out.install.cancel():
                return None  # at work; or staged just before the bound, and only returning its origin
            out.stop.set()
            origin = Origin("topic", fallback=f"emptied ({out.kind}): no export installed within "
                                              f"bootstrap_timeout_s = {self.export.bootstrap_timeout_s} s (storage "
                                              "slow or unreachable)", seconds=time.monotonic() - out.started,
                            uri=masked(self.export.uri))
        else:
            origin = out.worker.origin or Origin("topic", fallback="bootstrap ended without an answer")
            del self._out[table]
        self._record(table, origin)
        if origin.kind == "export":
            log.info("table %s: bootstrapped from export %s after a wipe (%d bytes in %.1f s)", table, origin.export,
                     origin.bytes_downloaded, origin.seconds)
            return Refilled(staging_dir(self.state_dir, table))
        log.warning("table %s: restoring from the topic: %s", table, origin.fallback)
        return Refilled(None)

    def cancel(self, table: str) -> None:
        out = self._out.get(table)
        if out is None:
            return
        out.stop.set()
        out.install.cancel()
        if not out.worker.is_alive():
            del self._out[table]
            shutil.rmtree(staging_dir(self.state_dir, table), ignore_errors=True)
