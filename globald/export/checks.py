"""The broker's side of an export's usability (``bootstrap``): asked on a thread of its own, beside the download.

The checks are those the bootstrap always made (the export's partitions still in the topic, each offset within
the log, the topic ID unchanged, the newest fingerprints read back: ``kafka.identity.verify``); only their time
moved. They took a third of a bootstrap's time at 1M keys, one round trip after the other, before the first byte
was downloaded. The store is opened only after they passed (``BrokerChecks.result``), so a refusal still leaves
nothing installed; it halts the download at its next chunk.
"""

from __future__ import annotations

import logging
import threading
import time

from globald.export.manifest import ExportManifest
from globald.kafka.clients import TransientKafkaError, log_bounds, make_consumer
from globald.kafka.identity import VERIFY_TIMEOUT_S, RecordReader, TopicIds, verify
from globald.settings.config import Config, TableConfig

log = logging.getLogger(__name__)


class Refused(Exception):
    """This export cannot be used (the message says why); an older one, or the topic, is used instead."""


class BrokerChecks:
    """Checks export ``m`` against the broker on a daemon thread (a stop or a refusal elsewhere: ``halt``, or the
    daemon's ``stop``, ends its waits). ``result()`` waits for it, then raises ``Refused`` or returns."""

    def __init__(self, config: Config, table: TableConfig, m: ExportManifest, stop: threading.Event,
                 halt: threading.Event) -> None:
        self.config, self.table, self.m, self.stop, self.halt = config, table, m, stop, halt
        self.lag_ms: int | None = None  # the topic's min.compaction.lag.ms (a versioned table's)
        self.seconds = 0.0
        self._refused: Refused | None = None
        self._failed: BaseException | None = None
        # "globald-bootstrap-": counted with the storage threads a stop may leave behind (target.STORAGE_THREADS)
        self._thread = threading.Thread(target=self._run, name=f"globald-bootstrap-checks-{table.name}", daemon=True)
        self._thread.start()

    def result(self) -> None:
        """Wait for the checks (the caller's own bound applies: a stop abandons the bootstrap's thread)."""
        self._thread.join()
        if self._refused is not None:
            raise self._refused
        if self._failed is not None:
            raise self._failed

    def refusal(self) -> Refused | None:
        """The refusal, when the checks already ended with one (without waiting)."""
        return None if self._thread.is_alive() else self._refused

    def _run(self) -> None:
        started = time.monotonic()
        try:
            self.check()
        except Refused as e:
            # After the download failed (it set halt, which cut the reads back short) the refusal is only its echo:
            # the download's own error is the reason then.
            if not self.halt.is_set():
                self._refused = e
                self.halt.set()  # the download stops at its next chunk
        except BaseException as e:  # a defect: raised on the bootstrap's thread, as before
            self._failed = e
            self.halt.set()
        finally:
            self.seconds = time.monotonic() - started

    def _wait(self, seconds: float) -> bool:
        return self.halt.wait(seconds) or self.stop.is_set()

    def check(self) -> None:
        m, topic = self.m, self.table.topic
        try:
            marks = log_bounds(make_consumer(self.config), topic)
        except TransientKafkaError as e:
            raise Refused(f"cannot ask the broker about topic {topic}: {e}") from None
        missing = sorted(set(m.offsets) - set(marks))
        if missing:
            raise Refused(f"partitions {missing} are not in topic {topic} any more")
        for p, o in sorted(m.offsets.items()):
            low, high = marks[p]
            if o < low:
                raise Refused(f"partition {p} is at offset {o}, below the log start {low}: records between are gone")
            if o > high:
                raise Refused(f"partition {p} is at offset {o}, past the log end {high}: another topic")
        ids = TopicIds(self.config.consumer_settings())
        try:
            if m.topic_id is not None:
                now = ids.get(topic, VERIFY_TIMEOUT_S)
                if now is not None and now != m.topic_id:
                    raise Refused(f"topic ID {m.topic_id}, the broker's topic is {now}: deleted and recreated since")
            if self.table.versioned:
                self.lag_ms = ids.compaction_lag_ms(topic, VERIFY_TIMEOUT_S)
        finally:
            ids.close()
        rungs = {p: r for p, r in m.ladders.items() if r}
        reader = RecordReader(self.config.consumer_settings(), self._wait)  # on this thread only
        try:
            verdict = verify(reader, topic, rungs, VERIFY_TIMEOUT_S)
        finally:
            reader.close()
        if verdict.recreated:
            raise Refused(f"topic {topic} is not the one exported: {verdict.describe()}")
        if verdict.unreachable:
            raise Refused(f"cannot read topic {topic} back at the export's fingerprints: "
                          f"{'; '.join(sorted(set(verdict.unreachable.values())))}")
        for p, why in sorted(verdict.unverifiable.items()):
            log.warning("table %s: export %s, partition %d: %s; the engine's check reads its older records back",
                        self.table.name, m.id, p, why)
