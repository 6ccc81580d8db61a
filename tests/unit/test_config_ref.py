"""One config reference (issue 43 item 3): a part that makes Kafka clients reads the ``ConfigRef`` when it makes
them, and makes new ones when the generation moved with its client settings; here the cluster worker, whose
clients the loop never reconfigures by hand. No broker is needed: the clients are made against a closed port and
never asked to reach it."""

from __future__ import annotations

import time
from dataclasses import replace

from globald.kafka.worker import Clients, ClusterWorker
from globald.settings.config import parse
from globald.settings.ref import ConfigRef

CONFIG = parse({"state_dir": "/srv/state", "kafka": {"bootstrap.servers": "127.0.0.1:9", "client.id": "before"},
                "tables": [{"name": "a", "topic": "ta"}]})
DEADLINE_S = 60.0  # answers come from the worker's own thread: generous on a loaded machine


def _clients(worker: ClusterWorker, key: str) -> Clients:
    """The clients the worker answers the question ``key`` with."""
    worker.ask(key, lambda clients: clients)
    deadline = time.monotonic() + DEADLINE_S
    while (answer := worker.take(key)) is None:
        assert time.monotonic() < deadline, f"no answer to {key} within {DEADLINE_S}s"
        time.sleep(0.01)
    return answer.result()


def test_the_ref_moves_its_generation_at_each_config_set() -> None:
    ref = ConfigRef(CONFIG)
    assert ref.get() == (CONFIG, 1) and ref.now is CONFIG
    new = replace(CONFIG, commit_interval_ms=7)
    assert ref.set(new) == 2 and ref.get() == (new, 2) and ref.generation == 2


def test_the_cluster_worker_makes_new_clients_only_when_a_reload_moved_its_client_settings() -> None:
    ref = ConfigRef(CONFIG)
    worker = ClusterWorker(ref, stuck_after_s=600.0)
    try:
        first = _clients(worker, "first")
        ref.set(replace(CONFIG, commit_interval_ms=7))  # a new generation, the same client settings
        assert _clients(worker, "same") is first
        ref.set(replace(CONFIG, kafka={**CONFIG.kafka, "client.id": "after"}))
        renewed = _clients(worker, "renewed")  # asked after the reload: of clients made with its [kafka]
        assert renewed is not first and renewed.ids._settings["client.id"] == "after"
        assert first.ids._settings["client.id"] == "before"
        assert _clients(worker, "again") is renewed  # made once per generation, not per question
    finally:
        assert worker.close()
