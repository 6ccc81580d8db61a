"""``python -m bench.rxstats run --config F``: the real daemon, with the bytes each of its Kafka clients received.

The daemon hands librdkafka's statistics (on when the config's ``[kafka]`` sets ``statistics.interval.ms``) to one
sink, ``globald.ops.memory.KAFKA_STATS``, which keeps only buffer sizes. For the bootstrap benchmark this entry
point also sums each emission's ``brokers.*.rxbytes`` (bytes received from every broker connection, the bootstrap
ones included) and writes the latest sum per client instance to the JSON file ``$GLOBALD_BENCH_RXSTATS``:
``{"rdkafka#consumer-1": {"rxbytes": n, "at": epoch_s}, ...}``. Bench-only; the daemon itself is unchanged.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

from globald.cli.main import main
from globald.ops import memory

ENV = "GLOBALD_BENCH_RXSTATS"


def install(path: Path) -> None:
    """Wrap the daemon's statistics sink so that every emission also records its client's received bytes."""
    seen: dict[str, dict[str, float]] = {}
    lock = threading.Lock()
    keep = memory.KafkaStats.__call__

    def counting(self: memory.KafkaStats, raw: str) -> None:
        keep(self, raw)
        try:
            doc = json.loads(raw)
            rx = sum(int(b.get("rxbytes", 0)) for b in (doc.get("brokers") or {}).values())
            name = str(doc.get("name", "?"))
        except (ValueError, AttributeError, TypeError):
            return
        with lock:
            seen[name] = {"rxbytes": rx, "at": time.time()}
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(json.dumps(seen))
            os.replace(tmp, path)

    memory.KafkaStats.__call__ = counting  # type: ignore[method-assign]


def received(path: Path) -> dict[str, dict[str, float]]:
    """What ``install`` wrote: per client instance, its latest received bytes and when ({} before any emission)."""
    try:
        doc: dict[str, dict[str, float]] = json.loads(path.read_text())
        return doc
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    install(Path(os.environ[ENV]))
    sys.exit(main())
