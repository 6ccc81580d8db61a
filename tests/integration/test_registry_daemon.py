"""Schema Registry by URL against the real daemon, a real broker and the real ``SchemaRegistryClient`` talking to the
registry double (tests/support/registry.py): a producer registers a new schema version mid-run and the daemon
decodes it without a restart; an outage leaves pending decodes, counted in status and /metrics and said as "schema
N not yet fetched", which resolve on the same snapshot once the registry is back; a restart with the registry down
starts, says so, and decodes every id it cached; a reload takes a subject's version as the reader schema (a moved
latest version of the same subject, another subject named instead of a file) and the daemon decodes a new snapshot
version with it at once. Every decoded value is compared with fastavro's own decode of the oracle fold at the
snapshot's offsets."""

from __future__ import annotations

import io
import json
import random
import shutil
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest

from globald.settings.config import load
from globald.store.names import snapshots_dir
from globald.typed import load_table
from globald.typed.arrow import python_rows
from globald.typed.columnar import ColumnarTable, columnar_path
from tests.harness import Broker, DaemonProcess, globald, listening_ports, oracle_at
from tests.integration.test_ops_http import HTTP, metric, port_of, scrape
from tests.integration.test_reload import reload
from tests.support.registry import RegistryDouble
from tests.unit.typed_fixtures import FIXTURES, avro_schema, confluent, customer_v1, customer_v2

pytestmark = pytest.mark.kafka

Daemon = Callable[..., DaemonProcess]
READER = avro_schema("customer_reader.avsc")
V1, V2 = avro_schema("customer_v1.avsc"), avro_schema("customer_v2.avsc")
# A third version a producer deploys mid-run: v2 and one more optional field, which the reader does not know.
V3 = {**V2, "fields": [*V2["fields"], {"name": "note", "type": ["null", "string"], "default": None}]}
SECTION = """[tables.value]
format = "avro"
schema = "schemas/customer_reader.avsc"
framing = "confluent"
writer_schemas = "registry"
"""


SECRET = "pw-Secret-9"


@pytest.fixture
def registry() -> Iterator[RegistryDouble]:
    with RegistryDouble(users={"svc": SECRET}) as r:
        yield r


def encode(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def produced(sid: int, schema: dict[str, Any], n: int, keys: int, seed: int) -> list[tuple[bytes, bytes | None]]:
    rnd = random.Random(seed)
    make = customer_v1 if schema is V1 else customer_v2
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(n):
        record = make(seed * 10_000 + i)
        if schema is V3:
            record = {**record, "note": f"n{i}" if i % 2 else None}
        out.append((b"cust-%04d" % rnd.randrange(keys), confluent(sid, encode(schema, record))))
    return out


def reference(registry: RegistryDouble, value: bytes, reader: dict[str, Any] = READER) -> Any:
    """fastavro itself: the writer schema the registry holds for the header's id, resolved to ``reader``."""
    sid = int.from_bytes(value[1:5], "big")
    writer = fastavro.parse_schema(json.loads(registry.schemas[sid].text))
    return fastavro.schemaless_reader(io.BytesIO(value[5:]), writer, fastavro.parse_schema(reader))


def decoded_at(d: DaemonProcess, ends: dict[int, int], timeout: float = 120) -> dict[str, Any]:
    """Status once the daemon has decoded the snapshot at ``ends``."""
    want = {str(p): o for p, o in ends.items()}

    def done(s: dict[str, Any]) -> bool:
        decode = s["tables"]["cust"].get("decode") or {}
        return decode.get("offsets") == want and decode.get("snapshot") == s["tables"]["cust"]["snapshot"]["current"]

    return d.wait_for(done, timeout=timeout, what=f"the snapshot at {want} decoded")["tables"]["cust"]["decode"]


def check_file(d: DaemonProcess, broker: Broker, registry: RegistryDouble, topic: str,
               decode: dict[str, Any]) -> None:
    """The decoded file's rows against fastavro's decode of the oracle fold at its offsets."""
    check_decoded(d, broker, topic, decode, lambda value: reference(registry, value))


def check_decoded(d: DaemonProcess, broker: Broker, topic: str, decode: dict[str, Any],
                  expect: Callable[[bytes], Any]) -> None:
    """Table cust's decoded file at ``decode`` against ``expect`` of each value of the oracle fold at its offsets."""
    config = load(d.config)
    decoder = load_table(config, "cust")[1]
    path = columnar_path(snapshots_dir(config.state_dir, "cust") / decode["snapshot"], decoder)
    table = ColumnarTable.open(path, decoder.fingerprint)
    oracle = oracle_at(broker, topic, decode["offsets"])
    assert table.keys.to_pylist() == sorted(oracle)
    assert python_rows(table.values) == [expect(oracle[k]) for k in sorted(oracle)]
    assert table.error_count == 0 == decode["errors"] and decode["pending"] == 0


def subject_section(subject: str) -> str:
    """Table cust's values: writer ids from the registry, the reader schema a subject's latest version."""
    return (f'[tables.value]\nformat = "avro"\nframing = "confluent"\nwriter_schemas = "registry"\n'
            f'subject = "{subject}"\n')


def decoded_anew(d: DaemonProcess, before: str) -> dict[str, Any]:
    """Status' decode of table cust once a snapshot version other than ``before`` is CURRENT and decoded."""
    def done(s: dict[str, Any]) -> bool:
        decode = s["tables"]["cust"].get("decode") or {}
        return decode.get("snapshot") not in (None, before) and \
            decode["snapshot"] == s["tables"]["cust"]["snapshot"]["current"]

    return d.wait_for(done, timeout=120, what=f"a snapshot version after {before} decoded")["tables"]["cust"]["decode"]


@pytest.mark.long
def test_new_writer_ids_mid_run_an_outage_pending_then_resolved_and_a_restart_with_the_registry_down(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path, registry: RegistryDouble) -> None:
    t = topic()
    shutil.copytree(FIXTURES, tmp_path / "schemas")
    one = registry.register("customers-value", V1)
    broker.admin.produce(t, produced(one, V1, 300, keys=120, seed=1))
    d = daemon({"cust": t}, start=False, http=HTTP, snapshots={"decode_interval_ms": 500},
               registry={"url": registry.url, "timeout": 5})
    text = d.config.read_text().replace("timeout = 5\n", f'timeout = 5\n"basic.auth.user.info" = "svc:{SECRET}"\n')
    d.config.write_text(text + SECTION)
    d.start()
    decode = decoded_at(d, broker.admin.end_offsets(t))
    check_file(d, broker, registry, t, decode)
    assert "'basic.auth.user.info': '***'" in d.tail(200) and SECRET not in d.log.read_text()

    # A producer deploys v2 mid-run: its id is fetched when its first record is decoded, no restart, no file copied.
    two = registry.register("customers-value", V2)
    broker.admin.produce(t, produced(two, V2, 300, keys=120, seed=2))
    decode = decoded_at(d, broker.admin.end_offsets(t))
    check_file(d, broker, registry, t, decode)
    assert registry.requests[f"GET /schemas/ids/{two}"] >= 1
    assert (d.state_dir / "registry" / "schemas" / f"{two}.avsc").exists()

    # An outage, and v3 deployed meanwhile: its values are pending decodes, counted and said, never bad records.
    registry.stop()
    three = registry.register("customers-value", V3)
    v3 = produced(three, V3, 50, keys=120, seed=3)
    broker.admin.produce(t, v3)
    ends = broker.admin.end_offsets(t)
    decode = decoded_at(d, ends)
    oracle = oracle_at(broker, t, decode["offsets"])
    waiting = sorted(k for k, v in oracle.items() if v is not None and v[1:5] == three.to_bytes(4, "big"))
    assert waiting and decode["pending"] == len(waiting) == decode["errors"], decode
    samples = scrape(port_of(d))
    assert metric(samples, "globald_table_decode_pending", table="cust") == len(waiting)
    text = globald("status", "--config", str(d.config))
    assert f"({len(waiting):,} pending: writer schema not yet fetched)" in text.stdout, text.stdout
    got = globald("get", "--config", str(d.config), "--table", "cust", "--decode", waiting[0].decode())
    assert f"schema {three} not yet fetched" in got.stdout + got.stderr, (got.stdout, got.stderr)
    # Every key rewritten by v3 meanwhile: every value waits for the registry, which status and the log say as an
    # outage that ends when it answers, never as a table declared wrong (issue 42).
    broker.admin.produce(t, [(b"cust-%04d" % k, confluent(three, encode(V3, {**customer_v2(k), "note": None})))
                             for k in range(120)])
    ends = broker.admin.end_offsets(t)
    decode = decoded_at(d, ends)
    assert decode["pending"] == decode["errors"] == decode["values"] > 0, decode
    outage = "the schema registry is unreachable"
    shown = globald("status", "--config", str(d.config)).stdout
    problem = next(line for line in shown.splitlines() if "problem:" in line)
    assert outage in problem and "the values will decode when it answers" in problem, shown
    assert "[tables.value]" not in shown, shown
    warned = [line for line in d.tail(400).splitlines() if "every value of snapshot" in line]
    assert warned and all(outage in line and "[tables.value]" not in line for line in warned), warned
    snapshot = decode["snapshot"]

    # The registry answers again: the same snapshot is decoded again, every pending value with it.
    registry.start()
    decode = d.wait_for(lambda s: (s["tables"]["cust"].get("decode") or {}).get("pending") == 0 and
                        s["tables"]["cust"]["decode"]["snapshot"] == snapshot, timeout=120,
                        what="the pending values decoded")["tables"]["cust"]["decode"]
    check_file(d, broker, registry, t, decode)
    assert "every pending value of snapshot" in d.tail(200)

    # A restart with the registry down: run starts, says so, and decodes every id it cached.
    d.stop()
    registry.stop()
    broker.admin.produce(t, produced(one, V1, 40, keys=120, seed=4) + produced(three, V3, 40, keys=120, seed=5))
    d.start()
    decode = decoded_at(d, broker.admin.end_offsets(t))
    check_file(d, broker, registry, t, decode)
    assert "decoding with the 3 schema(s) cached in state_dir" in d.tail(400)

    # A reload naming a subject instead of the reader schema file: the daemon takes that subject's latest version
    # from the registry, back again, and decodes the next snapshot version with it (v2: phone and visits).
    registry.start()
    reader = registry.register("customers-reader", V2)
    d.config.write_text(d.config.read_text().replace('schema = "schemas/customer_reader.avsc"\n',
                                                     'subject = "customers-reader"\n'))
    r = reload(d)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{d.tail()}"
    assert f"reader schema: table cust value: took customers-reader version 1 (schema {reader})" in d.tail(200)
    assert registry.requests["GET /subjects/customers-reader/versions/latest"] >= 1
    decode = decoded_anew(d, decode["snapshot"])
    check_decoded(d, broker, t, decode, lambda value: reference(registry, value, V2))
    assert SECRET not in d.log.read_text()


def test_status_says_starting_while_the_daemon_waits_for_the_registry_at_start(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, tmp_path: Path) -> None:
    """Issue 42: a daemon that holds its state_dir but has published no status yet (here: asking a registry that
    accepts connections and never answers, before its loop starts) is said as starting, exit 3, never as stopped."""
    from globald.common import exitcodes
    from globald.store.statedir import lock_holder

    t = topic()
    shutil.copytree(FIXTURES, tmp_path / "schemas")
    broker.admin.produce(t, produced(1, V1, 20, keys=10, seed=6))
    with socket.socket() as silent:  # the kernel completes connections to it (its backlog); nothing ever answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        d = daemon({"cust": t}, start=False, http={"enabled": True, "port": 0},
                   registry={"url": f"http://127.0.0.1:{silent.getsockname()[1]}", "timeout": 300})
        d.config.write_text(d.config.read_text().replace("timeout = 300\n", 'timeout = 300\n"max.retries" = 0\n')
                            + SECTION)
        d.start()
        deadline = time.monotonic() + 120
        while lock_holder(d.state_dir) != str(d.pid):
            assert d.alive() and time.monotonic() < deadline, d.tail()
            time.sleep(0.1)
        # The HTTP port the daemon bound (port 0: the kernel's pick, taken before the state_dir's lock), read from
        # its sockets: its status, which would name it, is what it has not published yet.
        (http_port,) = listening_ports(d.pid)
        r = globald("status", "--config", str(d.config))
        assert r.returncode == exitcodes.UNAVAILABLE, (r.returncode, r.stdout, r.stderr)
        assert r.stderr.splitlines() == [f"globald: globald (pid {d.pid}) is starting on state_dir {d.state_dir}: it "
                                         "holds the state_dir's lock and has published no status yet; ask again in "
                                         "a moment"], r.stderr
        doc = json.loads(globald("status", "--config", str(d.config), "--json").stdout)
        assert doc["state"] == "CREATED" and doc["pid"] == d.pid and doc["tables"] == {}, doc
        # Its HTTP port, taken before the state_dir, answers at once: not ready, starting (a probe left hanging on
        # a bound socket nobody accepts from held the chaos campaign past the restore it meant to fault).
        for path in ("/readyz", "/status"):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=10)
                raise AssertionError(f"{path} answered 2xx while the daemon starts")
            except urllib.error.HTTPError as e:
                assert e.code == 503 and json.loads(e.read())["state"] == "CREATED", path
    # Closed: the connections it held are reset, the daemon starts without the registry, and status is its own.
    d.wait_running({"cust": broker.admin.end_offsets(t)}, timeout=120)
    assert globald("status", "--config", str(d.config)).returncode == exitcodes.OK


def test_a_running_daemon_fetches_writer_ids_and_decodes_with_the_subject_version_a_reload_took(
        broker: Broker, topic: Callable[..., str], daemon: Daemon, registry: RegistryDouble) -> None:
    """The registry in ``make test`` (issue 40 item 5.9): a daemon fetches the writer id it meets from the registry
    and takes its reader schema from a subject; a producer registers the subject's version 2, and a reload of the
    same file takes it: the daemon publishes a new snapshot version at once, though no record arrived, and decodes
    it with version 2 (before, it kept the file decoded with version 1 until a record came). Each decoded file is
    compared with fastavro's decode of the oracle fold at its offsets."""
    t = topic()
    one = registry.register("customers-value", V1)
    broker.admin.produce(t, produced(one, V1, 40, keys=20, seed=7))
    d = daemon({"cust": t}, start=False, snapshots={"decode_interval_ms": 200},
               registry={"url": registry.url, "timeout": 5})
    text = d.config.read_text().replace("timeout = 5\n", f'timeout = 5\n"basic.auth.user.info" = "svc:{SECRET}"\n')
    d.config.write_text(text + subject_section("customers-value"))
    d.start()
    decode = decoded_at(d, broker.admin.end_offsets(t))
    check_decoded(d, broker, t, decode, lambda value: reference(registry, value, V1))
    assert registry.requests[f"GET /schemas/ids/{one}"] >= 1 and (d.state_dir / f"registry/schemas/{one}.avsc").exists()
    assert "reader schema: table cust value: took customers-value version 1" in d.tail(200)

    two = registry.register("customers-value", V2)
    r = reload(d)
    assert r.returncode == 0, f"{r.stdout}{r.stderr}\n{d.tail()}"
    assert f"moved customers-value from version 1 to 2 (schema {two})" in d.tail(200)
    decode = decoded_anew(d, decode["snapshot"])
    # The columnar file named by the fingerprint of version 2, its values read with version 2.
    check_decoded(d, broker, t, decode, lambda value: reference(registry, value, V2))
    assert SECRET not in d.log.read_text()
