"""``globald dev --registry``: the local Schema Registry beside the dev broker, with the typed page's schema registered.

It serves ``globald.embedded.registry.LocalRegistry`` on a free 127.0.0.1 port, in a thread of the ``globald dev``
process (so it stops with it, Ctrl-C or SIGTERM, and leaves no process behind), registers ``CUSTOMER`` (the Avro
schema of docs/typed-tables.md) under ``<topic>-value`` for each ``--topic``, the subject Confluent's serializers
use for a topic's values by default (TopicNameStrategy), and appends the ``[registry]`` table to the config
``globald dev`` wrote, so a table can say ``writer_schemas = "registry"`` and ``subject = "<topic>-value"``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from globald.embedded.registry import LocalRegistry

# The page's reader schema (docs/typed-tables.md, customer.avsc; its test holds the two equal): version 1 of each
# subject, the schema the page's producer writes with until it registers a newer one.
CUSTOMER: dict[str, Any] = {"type": "record", "name": "Customer", "namespace": "shop",
            "fields": [{"name": "id", "type": "long"},
                       {"name": "name", "type": "string"},
                       {"name": "city", "type": ["null", "string"], "default": None}]}


def value_subject(topic: str) -> str:
    """The subject of a topic's values under Confluent's default TopicNameStrategy."""
    return f"{topic}-value"


def serve_for_dev(config: Path, topics: Sequence[str]) -> tuple[LocalRegistry, list[str]]:
    """Start the registry, register ``CUSTOMER`` for each topic, append ``[registry]`` to ``config``: (registry, the
    lines globald dev prints). The registry is stopped again if any of it fails."""
    registry = LocalRegistry().start()
    try:
        lines = [f"  registry: {registry.url} (a local Schema Registry in this process; [registry] in the config)"]
        for topic in topics:
            subject = value_subject(topic)
            sid = registry.register(subject, CUSTOMER)
            fields = ", ".join(f["name"] for f in CUSTOMER["fields"])
            lines.append(f"  subject {subject}: version 1, schema id {sid} (shop.Customer: {fields})")
        if not topics:
            lines.append("  no subject registered: --topic NAME registers shop.Customer under NAME-value")
        with config.open("a") as f:
            f.write("\n# The local Schema Registry of `globald dev --registry`: it runs in the globald dev process and "
                    "stops with it.\n"
                    f"[registry]\nurl = {json.dumps(registry.url)}\n")
    except BaseException:
        registry.stop()
        raise
    return registry, lines
