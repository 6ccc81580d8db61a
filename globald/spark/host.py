"""Which sidecar an executor reads: the one on its own host, found through the host's own config.

An executor uses the config file named by ``$GLOBALD_CONFIG`` in its own environment when that is set, else the
config path given to ``GlobalTableView`` on the driver. Only the host's side is taken from that file: the state_dir
its sidecar publishes snapshots in, and ``[snapshots] serve_stale``. The table, its topic and the offsets to read
come from the driver's descriptor, so every host reads the same version of the table whatever its config says
about anything else. A host config that does not mirror the table, or mirrors another topic under that name, is
refused: offsets of one topic say nothing about another.

Every failure an executor reports names where it happened (``HostSidecar.where``): the host, the sidecar's
state_dir and which config file was used, and why it was chosen.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from globald.common.errors import ExecutorConfigError, GlobaldError
from globald.settings.config import Config, load

CONFIG_ENV = "GLOBALD_CONFIG"
FROM_ENV = f"${CONFIG_ENV}"
FROM_DRIVER = "the path given to GlobalTableView"


@dataclass(frozen=True)
class HostSidecar:
    """The local sidecar an executor reads, as its host's config describes it."""

    host: str
    config_path: str
    source: str  # FROM_ENV or FROM_DRIVER
    state_dir: Path
    serve_stale: bool

    def where(self) -> str:
        return f"host {self.host}, sidecar state_dir {self.state_dir} (config {self.config_path}, {self.source})"


def config_path(driver_path: str, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The config file this host's executors use, and why: ``$GLOBALD_CONFIG`` when set and not blank, else the
    driver's path (hosts that keep their config where the driver's is)."""
    env = os.environ if environ is None else environ
    own = env.get(CONFIG_ENV, "").strip()
    return (own, FROM_ENV) if own else (driver_path, FROM_DRIVER)


@lru_cache(maxsize=8)
def _load(path: str) -> Config:
    return load(path)


def sidecar(driver_path: str, table: str, topic: str | None, environ: Mapping[str, str] | None = None,
            host: str | None = None) -> HostSidecar:
    """This host's sidecar for ``table`` (mirroring ``topic``, the driver's). Raises ExecutorConfigError naming
    the host, the config used, the table and what is wrong."""
    path, source = config_path(driver_path, environ)
    host = host or socket.gethostname()
    where = f"host {host}, config {path} ({source})"
    try:
        cfg = _load(path)
    except GlobaldError as e:
        hint = "" if source == FROM_ENV else f"; set {CONFIG_ENV} in the executors' environment to this host's config"
        raise ExecutorConfigError(f"{where}: table {table}: cannot use the config: {e}{hint}") from None
    try:
        own = cfg.table(table)
    except GlobaldError as e:
        raise ExecutorConfigError(f"{where}: table {table}: {e}; this host's sidecar does not mirror it") from None
    if topic is not None and own.topic != topic:
        raise ExecutorConfigError(f"{where}: table {table}: this host's sidecar mirrors topic {own.topic!r}, the "
                                  f"driver's descriptor topic {topic!r}; offsets of one say nothing about the other")
    return HostSidecar(host, path, source, cfg.state_dir, cfg.snapshots.serve_stale)
