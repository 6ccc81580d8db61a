"""``globald dev --registry``'s set-up (``globald.embedded.dev_registry``), no broker: the registry it serves binds
127.0.0.1 and holds the typed page's schema under each topic's value subject, the ``[registry]`` table it appends
makes a config globald loads (a table on that subject included), and nothing answers once it is stopped."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from globald.embedded.dev_registry import CUSTOMER, serve_for_dev
from globald.settings.config import load
from tests.harness import REPO

TABLE = """
[[tables]]
name = "customers_avro"
topic = "customers-avro"
[tables.value]
format = "avro"
framing = "confluent"
writer_schemas = "registry"
subject = "customers-avro-value"
"""


def test_the_registry_holds_the_pages_schema_and_the_config_names_it(tmp_path: Path) -> None:
    config = tmp_path / "globald.toml"
    config.write_text('state_dir = "state"\n[kafka]\n"bootstrap.servers" = "127.0.0.1:9"\n\n[[tables]]\n'
                      'name = "customers"\ntopic = "customers"\n')
    registry, lines = serve_for_dev(config, ["customers-avro", "orders"])
    try:
        assert registry._server is not None and registry._server.server_address[0] == "127.0.0.1"
        assert lines[0].startswith(f"  registry: {registry.url} ")
        assert lines[1:] == ["  subject customers-avro-value: version 1, schema id 1 (shop.Customer: id, name, city)",
                             "  subject orders-value: version 1, schema id 1 (shop.Customer: id, name, city)"]
        with urllib.request.urlopen(f"{registry.url}/subjects/customers-avro-value/versions/latest") as r:
            doc = json.load(r)
        assert (doc["version"], doc["id"], json.loads(doc["schema"])) == (1, 1, CUSTOMER)
        with config.open("a") as f:  # the page's table, added after the block globald dev wrote
            f.write(TABLE)
        loaded = load(config)
        assert loaded.registry is not None and loaded.registry["url"] == registry.url
        assert [t.name for t in loaded.tables] == ["customers", "customers_avro"]
    finally:
        registry.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", registry.port), timeout=5).close()


def test_without_a_topic_no_subject_is_registered_and_the_line_says_how(tmp_path: Path) -> None:
    config = tmp_path / "globald.toml"
    config.write_text("")
    registry, lines = serve_for_dev(config, [])
    registry.stop()
    assert registry.subjects == {} and "--topic NAME registers shop.Customer under NAME-value" in lines[-1]


def test_the_schema_registered_is_the_pages(tmp_path: Path) -> None:
    """The page's walkthroughs write with the reader schema its first section shows: the one registered."""
    page = (REPO / "docs" / "typed-tables.md").read_text()
    shown = page.split('```json title="typed-dev/schemas/customer.avsc"\n', 1)[1].split("```", 1)[0]
    assert json.loads(shown) == CUSTOMER
