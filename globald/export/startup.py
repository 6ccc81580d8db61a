"""At daemon start, before the engine plans: bootstrap every table whose store is empty, each on a worker thread,
while the caller watches its stop event, within ``[export] bootstrap_timeout_s``. Storage that is unreachable or
slow costs at most that bound; the table then restores from the topic, and status says why."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable

from globald.export.bootstrap import Abandoned, Bootstrap, Install, Origin, needs_bootstrap, staging_dir
from globald.export.target import Target, TargetError, masked
from globald.settings.config import Config, TableConfig

log = logging.getLogger(__name__)

_WATCH_S = 0.1  # how often the caller's stop is looked at: well within the daemon's one-second stop bound


class BootstrapWorker(threading.Thread):
    def __init__(self, config: Config, table: TableConfig, stop: threading.Event, install: Install | None = None,
                 ) -> None:
        super().__init__(name=f"globald-bootstrap-{table.name}", daemon=True)  # abandoned on a stop or past the bound
        self.config, self.table, self.stop = config, table, stop
        self.install = install or Install()
        self.origin: Origin | None = None

    def run(self) -> None:
        assert self.config.export is not None
        try:
            target = Target(self.config.export.uri)
            self.origin = Bootstrap(self.config, self.table, target, self.stop, self.install).run()
        except TargetError as e:
            self.origin = Origin("topic", fallback=str(e), uri=masked(self.config.export.uri))
        except Abandoned as e:
            self.origin = Origin("topic", fallback=f"bootstrap abandoned: {e}", uri=masked(self.config.export.uri))
        except Exception as e:  # a defect must not keep the table from restoring from the topic
            log.exception("table %s: bootstrap failed", self.table.name)
            self.origin = Origin("topic", fallback=f"bootstrap failed: {type(e).__name__}: {e}",
                                 uri=masked(self.config.export.uri))


def bootstrap_empty_tables(config: Config, wait_stop: Callable[[float], bool]) -> dict[str, Origin]:
    """Origins of every table (``store`` for those that had one). ``wait_stop(s)`` waits up to ``s`` seconds and
    says whether the daemon is stopping; then the workers are given up and what they did not install is not."""
    export = config.export
    assert export is not None
    origins: dict[str, Origin] = {}
    workers: list[BootstrapWorker] = []
    stop = threading.Event()
    for t in config.tables:
        shutil.rmtree(staging_dir(config.state_dir, t.name), ignore_errors=True)  # a download a stop cut short
        if not needs_bootstrap(config.state_dir, t.name):
            origins[t.name] = Origin("store")
        elif not export.bootstrap:
            origins[t.name] = Origin("topic", fallback="bootstrap = false", uri=masked(export.uri))
        else:
            w = BootstrapWorker(config, t, stop)
            log.info("table %s: store empty; looking for an export in %s", t.name, masked(export.uri))
            w.start()
            workers.append(w)
    started = time.monotonic()
    deadline = started + export.bootstrap_timeout_s
    while any(w.is_alive() for w in workers):
        if wait_stop(_WATCH_S) or time.monotonic() >= deadline:
            break
    stopping = wait_stop(0)
    stop.set()
    for w in workers:
        if w.origin is None and not w.install.cancel():
            w.join(1.0)  # installed just before the cancel: the worker is only returning its origin
        if w.origin is None:
            why = "the daemon is stopping" if stopping else \
                f"no export installed within bootstrap_timeout_s = {export.bootstrap_timeout_s} s (storage slow " \
                "or unreachable)"
            w.origin = Origin("topic", fallback=why, seconds=time.monotonic() - started, uri=masked(export.uri))
        origin = w.origin or Origin("export", uri=masked(export.uri))
        origins[w.table.name] = origin
        if origin.kind == "export":
            log.info("table %s: bootstrapped from export %s (%d bytes in %.1f s); tailing the topic from %s",
                     w.table.name, origin.export, origin.bytes_downloaded, origin.seconds, origin.offsets)
        else:
            log.warning("table %s: restoring from the topic: %s", w.table.name, origin.fallback)
    return origins
