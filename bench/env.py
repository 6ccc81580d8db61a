"""The benchmark's world: one embedded broker, a scratch directory, and the client settings every pipeline shares.

Every pipeline (globald and the baselines) consumes with the same librdkafka settings, those globald itself
would use, so that a ratio measures the design and not a tuning difference. Everything lives under one scratch
directory that is removed at the end.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from globald.settings import config as configmod
from globald.settings.config import Config
from tests.harness import DaemonProcess, write_config
from tests.support.admin import TopicAdmin
from tests.support.broker import EmbeddedKafka


@dataclass
class BenchEnv:
    root: Path
    kafka: EmbeddedKafka
    admin: TopicAdmin
    _dirs: int = field(default=0)

    @classmethod
    def start(cls, scratch: Path | None = None) -> BenchEnv:
        root = Path(tempfile.mkdtemp(prefix="globald-bench-", dir=scratch))
        # The log cleaner is left on (the topic is compacted) but the data fits in one active segment per
        # partition, which the cleaner never touches: every produced record stays in the log.
        kafka = EmbeddedKafka(root / "kafka").start()
        return cls(root=root, kafka=kafka, admin=TopicAdmin.for_broker(kafka.client_settings, kafka.zookeeper))

    @property
    def settings(self) -> dict[str, Any]:
        return self.kafka.client_settings

    def fresh_dir(self, what: str) -> Path:
        self._dirs += 1
        d = self.root / "work" / f"{self._dirs:03d}-{what}"
        d.mkdir(parents=True)
        return d

    def config(self, state_dir: Path, tables: dict[str, str], **top: Any) -> Config:
        """A globald config for ``tables`` ({name: topic}) against this broker."""
        raw: dict[str, Any] = {
            "state_dir": str(state_dir),
            "kafka": {**self.settings, "log_level": 3},
            "tables": [{"name": n, "topic": t} for n, t in tables.items()],
            "http": {"enabled": False},
            **top,
        }
        return configmod.parse(raw)

    def daemon(self, tables: dict[str, str], what: str) -> DaemonProcess:
        """The real daemon (``python -m globald run``) on ``tables``, not started; its state_dir is fresh."""
        workdir = self.fresh_dir(what)
        config = write_config(workdir / "globald.toml", workdir / "state", {**self.settings, "log_level": 3}, tables,
                              http={"enabled": False})
        return DaemonProcess(config, workdir / "daemon.log")

    def consumer_settings(self) -> dict[str, Any]:
        """What globald's consumer would be given, without a logger: shared by every baseline."""
        probe = self.config(self.root / "probe", {"probe": "probe"})
        return {**probe.consumer_settings(), "group.id": "globald-bench"}

    def stop(self) -> None:
        self.admin.close()
        self.kafka.stop()
        shutil.rmtree(self.root, ignore_errors=True)
