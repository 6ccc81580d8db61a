"""The embedded 0.9 broker (``globald.embedded.broker``) with what only tests and benchmarks do to it: find the
broker's process, and stop or signal the broker alone while ZooKeeper runs on. Not shipped in the wheel.
"""

from __future__ import annotations

import signal

from globald.embedded import broker as product
from globald.embedded.broker import stop_process


class EmbeddedKafka(product.EmbeddedKafka):
    @property
    def broker_pid(self) -> int | None:
        return self._kafka.pid if self._kafka is not None and self._kafka.poll() is None else None

    def stop_broker(self, sig: int = signal.SIGTERM) -> None:
        stop_process(self._kafka, sig)
