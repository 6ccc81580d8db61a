"""A Schema Registry in trouble, other than "connection refused": silent, 503 and 429 with ``Retry-After``, 401,
slower than the client's timeout (the double's modes, tests/support/registry.py), against the real
``SchemaRegistryClient``. Each is a pending decode that says why, never a bad record; a ``Retry-After`` holds every
process of the host (the daemon starts a decode process per attempt), and a silent registry costs one timeout, not
one per writer id."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from globald import typed
from globald.settings.config import load
from globald.typed import registry as registry_module
from globald.typed.arrow import PendingSchema
from tests.harness import globald
from tests.support import registry as doubles
from tests.support.registry import RegistryDouble
from tests.unit.test_registry import V1, V2, v1, v2, write_config
from tests.unit.typed_fixtures import FIXTURES, customer_v1

TIMEOUT = 1  # the client's timeout in these tests, seconds


@pytest.fixture
def registry() -> Iterator[RegistryDouble]:
    with RegistryDouble() as r:
        yield r


def decoder(tmp_path: Path, url: str) -> typed.arrow.Decoder:
    """A fresh decoder, as a new decode process of the daemon has: no memory but state_dir."""
    shutil.copy(FIXTURES / "customer_reader.avsc", tmp_path / "reader.avsc")
    path = write_config(tmp_path, url, 'writer_schemas = "registry"\nschema = "reader.avsc"')
    path.write_text(path.read_text().replace("\ntimeout = 5\n", f"\ntimeout = {TIMEOUT}\n"))
    config = load(path)
    return typed.load_table(config, "customers")[1]


@pytest.mark.long  # ~7 s for the five: make test keeps the Retry-After, timeout and reload ones (~4 s)
@pytest.mark.parametrize("mode,said", [(doubles.UNAVAILABLE, "HTTP 503"), (doubles.THROTTLED, "HTTP 429"),
                                       (doubles.UNAUTHORIZED, "unauthorized (HTTP 401"),
                                       (doubles.SILENT, "unreachable (ReadTimeout"),
                                       (doubles.SLOW, "unreachable (ReadTimeout")])
def test_each_fault_is_a_pending_decode_that_says_why_and_resolves_when_healed(
        tmp_path: Path, registry: RegistryDouble, mode: str, said: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "RETRY_S", 0.5)  # the wait a timeout leaves, short for the test
    one = registry.register("customers-value", V1)
    registry.fault(mode, retry_after=1, delay_s=TIMEOUT * 3)
    with pytest.raises(PendingSchema, match=f"schema {one} not yet fetched") as e:
        decoder(tmp_path, registry.url).decode_value(v1(one, 1))
    assert said in str(e.value) and registry.faulted[mode] >= 1
    registry.heal()
    deadline = time.monotonic() + 60  # past any wait the fault left (Retry-After 1 s, a timeout's RETRY_S)
    while True:
        try:
            got = decoder(tmp_path, registry.url).decode_value(v1(one, 2))
            break
        except PendingSchema:
            assert time.monotonic() < deadline, "still pending a minute after the registry was healed"
            time.sleep(0.2)
    assert got["id"] == customer_v1(2)["id"]


@pytest.mark.parametrize("mode", [doubles.THROTTLED, doubles.UNAVAILABLE])
def test_retry_after_holds_every_process_until_it_passes(tmp_path: Path, registry: RegistryDouble,
                                                         mode: str) -> None:
    one = registry.register("customers-value", V1)
    registry.fault(mode, retry_after=120)
    with pytest.raises(PendingSchema, match="Retry-After 120s"):
        decoder(tmp_path, registry.url).decode_value(v1(one, 1))
    asked = sum(registry.requests.values())
    # The next decode process, and the next id: not asked before Retry-After has passed, and it says so.
    with pytest.raises(PendingSchema, match=r"not asked again for 1[12]\ds"):
        decoder(tmp_path, registry.url).decode_value(v1(one, 2))
    two = registry.register("customers-value", V2)
    with pytest.raises(PendingSchema, match="Retry-After"):
        decoder(tmp_path, registry.url).decode_value(v2(two, 3))
    assert sum(registry.requests.values()) == asked


def test_a_silent_registry_costs_one_timeout_not_one_per_id(tmp_path: Path, registry: RegistryDouble) -> None:
    one = registry.register("customers-value", V1)
    two = registry.register("customers-value", V2)
    registry.fault(doubles.SILENT)
    with pytest.raises(PendingSchema, match="unreachable"):
        decoder(tmp_path, registry.url).decode_value(v1(one, 1))
    t0 = time.monotonic()
    with pytest.raises(PendingSchema, match="not asked again"):
        decoder(tmp_path, registry.url).decode_value(v2(two, 2))  # another id, another process
    assert time.monotonic() - t0 < TIMEOUT / 2
    assert registry.faulted[doubles.SILENT] == 1


def test_retry_after_is_seconds_or_a_date_and_bounded() -> None:
    from globald.typed.registry_http import retry_after

    assert retry_after("30") == 30 and retry_after(None) is None and retry_after("soon") is None
    assert retry_after("99999999") == 900.0 and retry_after("-5") == 0.0
    assert 50 < (retry_after(time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))) or 0) <= 60


@pytest.mark.parametrize("mode", [doubles.THROTTLED, doubles.UNAUTHORIZED])
def test_a_reload_goes_through_a_registry_in_trouble_check_config_does_not(tmp_path: Path, registry: RegistryDouble,
                                                                         mode: str) -> None:
    """``run`` starts through a registry outage; a reload must too (and the watcher never tries refused bytes
    again until they change: a change made during an outage would never be applied). ``check-config`` itself stays
    strict, and a subject the registry says it does not have still refuses the reload."""
    from globald.service.reload import _check_config

    shutil.copy(FIXTURES / "customer_reader.avsc", tmp_path / "reader.avsc")
    path = write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nschema = "reader.avsc"')
    registry.fault(mode, retry_after=60)
    assert _check_config(path) is None
    strict = globald("check-config", "--config", str(path))
    assert strict.returncode == 2 and "registry.url" in strict.stderr, strict.stderr
    registry.heal()
    named = write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "nobody-value"')
    assert "subject not found: 'nobody-value'" in (_check_config(named) or "")
