"""Schema Registry by URL (issue 35): the real ``SchemaRegistryClient`` against the registry double
(tests/support/registry.py), no broker. Writer ids fetched when first met and cached durably; an outage is a pending
decode that says so and resolves; reader schemas pinned from a subject; references; auth; check-config's one line;
secrets from the environment or a file, masked."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from globald import typed
from globald.common.errors import ConfigError
from globald.settings.config import Config, load
from globald.settings.kafka_properties import secret_values
from globald.typed.arrow import PendingSchema, python_rows
from globald.typed.columnar import ColumnarInvalid, ColumnarTable, build_table, write_columnar
from globald.typed.references import inline
from globald.typed.registry import take_reader_schemas
from tests.harness import globald
from tests.support.registry import RegistryDouble
from tests.unit.typed_fixtures import FIXTURES, avro_payload, avro_schema, confluent, customer_v1, customer_v2

V1, V2 = avro_schema("customer_v1.avsc"), avro_schema("customer_v2.avsc")


@pytest.fixture
def registry() -> Iterator[RegistryDouble]:
    with RegistryDouble() as r:
        yield r


def write_config(tmp_path: Path, url: str, value: str, registry_extra: str = "", fmt: str = "avro") -> Path:
    path = tmp_path / "g.toml"
    path.write_text(f"""
state_dir = "state"
[kafka]
"bootstrap.servers" = "127.0.0.1:9"
[registry]
url = "{url}"
"max.retries" = 0
timeout = 5
{registry_extra}
[[tables]]
name = "customers"
topic = "customers"
[tables.value]
format = "{fmt}"
framing = "confluent"
{value}
""")
    return path


def decoder(config: Config) -> typed.arrow.Decoder:
    return typed.load_table(config, "customers")[1]


def v1(sid: int, i: int) -> bytes:
    return confluent(sid, avro_payload("customer_v1.avsc", customer_v1(i)))


def v2(sid: int, i: int) -> bytes:
    return confluent(sid, avro_payload("customer_v2.avsc", customer_v2(i)))


def test_writer_ids_are_fetched_when_first_met_and_decode_from_the_cache_with_the_registry_down(
        tmp_path: Path, registry: RegistryDouble) -> None:
    one = registry.register("customers-value", V1)
    config = load(write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nschema = "reader.avsc"'))
    shutil.copy(FIXTURES / "customer_reader.avsc", tmp_path / "reader.avsc")
    dec = decoder(config)
    assert dec.decode_value(v1(one, 1))["id"] == customer_v1(1)["id"]
    # A producer deploys schema v2 while the reader runs: its id is fetched when its first record arrives.
    two = registry.register("customers-value", V2)
    assert dec.decode_value(v2(two, 2))["id"] == customer_v2(2)["id"]
    assert registry.requests[f"GET /schemas/ids/{two}"] == 1
    assert sorted(p.name for p in (config.state_dir / "registry" / "schemas").iterdir()) == ["1.avsc", "2.avsc"]
    # A restart with the registry down decodes every id seen before, from state_dir.
    registry.stop()
    again = decoder(config)
    assert again.decode_value(v1(one, 3))["id"] == customer_v1(3)["id"]
    assert again.decode_value(v2(two, 4))["id"] == customer_v2(4)["id"]


def test_an_outage_is_a_pending_decode_that_says_so_and_resolves(tmp_path: Path, registry: RegistryDouble) -> None:
    shutil.copy(FIXTURES / "customer_reader.avsc", tmp_path / "reader.avsc")
    config = load(write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nschema = "reader.avsc"'))
    one = registry.register("customers-value", V1)
    dec = decoder(config)
    assert dec.decode_value(v1(one, 0))["id"] == customer_v1(0)["id"]  # id 1 met, fetched and cached
    registry.stop()
    registry.register("customers-value", V2)  # registered while the reader cannot see it
    values = pa.array([v1(one, 1), v2(2, 2), v2(2, 3), None], pa.binary())
    got = dec.decode(values)
    assert got.pending == (2,) and got.pending_count == 2 and got.error_count == 2
    assert got.errors[1].as_py().startswith("schema 2 not yet fetched (registry http://127.0.0.1:")
    assert "unreachable" in got.errors[1].as_py()
    with pytest.raises(PendingSchema, match="schema 2 not yet fetched"):
        dec.decode_value(v2(2, 2))
    # The columnar file records its pending ids; once one can be had, the file is no longer valid and is redone.
    items = [(b"k%d" % i, v, 0) for i, v in enumerate(values.to_pylist()) if v is not None]
    built = build_table(items, dec, {"table": "customers", "snapshot": "s"})
    path = tmp_path / "columnar.arrow"
    write_columnar(path, built)
    assert ColumnarTable.open(path, dec.fingerprint, dec.available).pending == 2  # still down: the file holds
    registry.start()
    fresh = decoder(config)  # another process: its own retry clock
    with pytest.raises(ColumnarInvalid, match=r"before writer schema\(s\) \[2\] were fetched"):
        ColumnarTable.open(path, fresh.fingerprint, fresh.available)
    redone = ColumnarTable(build_table(items, fresh, {"table": "customers", "snapshot": "s"}))
    assert redone.pending == 0 and redone.error_count == 0
    assert [r["id"] for r in python_rows(redone.values)] == [customer_v1(1)["id"], customer_v2(2)["id"],
                                                             customer_v2(3)["id"]]


def test_an_id_the_registry_does_not_have_is_a_decode_error_not_pending(tmp_path: Path,
                                                                        registry: RegistryDouble) -> None:
    shutil.copy(FIXTURES / "customer_reader.avsc", tmp_path / "reader.avsc")
    config = load(write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nschema = "reader.avsc"'))
    json_id = registry.register("other-value", '{"type": "object"}', kind="JSON")
    got = decoder(config).decode(pa.array([v1(77, 1), v1(json_id, 2)], pa.binary()))
    assert got.pending == () and "schema 77 is not in the registry" in got.errors[0].as_py()
    assert "40403" in got.errors[0].as_py()
    assert f"schema {json_id} is JSON, not AVRO" in got.errors[1].as_py()  # an answer, not an outage


def test_the_reader_schema_is_the_subjects_version_taken_at_start_until_taken_again(
        tmp_path: Path, registry: RegistryDouble) -> None:
    registry.register("customers-value", V1)
    config = load(write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "customers-value"'))
    assert take_reader_schemas(config) == [(True, "table customers value: took customers-value version 1 "
                                                  "(schema 1)")]
    assert "visits" not in [f.name for f in decoder(config).arrow_type]
    two = registry.register("customers-value", V2)
    # Readers keep the version the daemon took, whatever the registry's latest is now...
    before = decoder(config)
    assert "visits" not in [f.name for f in before.arrow_type]
    # ...until it is taken again (a reload): the fingerprint changes with it, so readers see a new declaration.
    assert take_reader_schemas(config)[0] == (True, "table customers value: moved customers-value from version 1 "
                                                    f"to 2 (schema {two})")
    after = decoder(config)
    assert "visits" in [f.name for f in after.arrow_type] and after.fingerprint != before.fingerprint
    assert after.decode_value(v1(1, 5))["visits"] == 0  # v2's default, resolved from a v1 record
    # Down: the pin taken before stays in force, and says so.
    registry.stop()
    taken, line = take_reader_schemas(config)[0]
    assert not taken and "unreachable" in line and "keeping version 2" in line
    assert take_reader_schemas(config, reachable=False)[0] == (
        False, f"table customers value: registry {registry.url} is down; keeping version 2 (schema {two}) taken "
               "before")
    assert decoder(config).fingerprint == after.fingerprint


def test_a_reload_redeclares_a_table_whose_subject_version_moved(tmp_path: Path, registry: RegistryDouble) -> None:
    """The same file reloaded after the subject's latest moved: the table counts as redeclared in place (a new
    snapshot version, decoded with the new version, at once); kept or unreachable, nothing is redeclared."""
    from globald.service.reload import Reloader
    from globald.settings.ref import ConfigRef

    registry.register("customers-value", V1)
    config = load(write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "customers-value"'))
    take_reader_schemas(config)  # the daemon's start
    reloader = Reloader(ConfigRef(config), None, lambda delta: [], lambda: None)
    assert reloader._take_reader_schemas(config, []) == []  # kept: the latest is the version taken
    registry.register("customers-value", V2)
    changed = reloader._take_reader_schemas(config, [])
    assert [c.key for c in changed] == ["tables.customers"] and changed[0].redeclared == config.tables[0]
    registry.register("customers-value", {**V2, "doc": "v3"})
    assert reloader._take_reader_schemas(config, changed) == []  # already changed by the file: not twice
    registry.stop()
    assert reloader._take_reader_schemas(config, []) == []  # down: the pin in force stays


def test_a_pinned_subject_version(tmp_path: Path, registry: RegistryDouble) -> None:
    registry.register("customers-value", V1)
    registry.register("customers-value", V2)
    config = load(write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "customers-value"\n'
                                                        "subject_version = 1"))
    assert "visits" not in [f.name for f in decoder(config).arrow_type]


def test_references_are_inlined_at_first_use(tmp_path: Path, registry: RegistryDouble) -> None:
    address = {"type": "record", "name": "Address", "namespace": "shop",
               "fields": [{"name": "city", "type": "string"}]}
    registry.register("shop.Address", address)
    person = {"type": "record", "name": "Person", "namespace": "shop",
              "fields": [{"name": "home", "type": "shop.Address"}, {"name": "work", "type": ["null", "Address"]}]}
    sid = registry.register("people-value", person, references=[{"name": "shop.Address", "subject": "shop.Address",
                                                                  "version": 1}])
    config = load(write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "people-value"'))
    dec = decoder(config)
    import fastavro

    full = inline(person, {"shop.Address": address})
    payload = avro_bytes(full, {"home": {"city": "Lyon"}, "work": {"city": "Nice"}})
    assert dec.decode_value(confluent(sid, payload)) == {"home": {"city": "Lyon"}, "work": {"city": "Nice"}}
    assert fastavro.parse_schema(full)  # self-contained: Address defined once, then named


def avro_bytes(schema: Any, record: dict[str, Any]) -> bytes:
    import io

    import fastavro

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def test_basic_auth_and_bearer_tokens_the_clients_way(tmp_path: Path) -> None:
    with RegistryDouble(users={"svc": "s3cret-pw"}, tokens={"tok-123456"}) as r:
        r.register("customers-value", V1)
        value = 'writer_schemas = "registry"\nsubject = "customers-value"'
        ok = load(write_config(tmp_path, r.url, value, '"basic.auth.user.info" = "svc:s3cret-pw"'))
        assert "visits" not in [f.name for f in decoder(ok).arrow_type]
        bearer = ('"bearer.auth.credentials.source" = "STATIC_TOKEN"\n"bearer.auth.token" = "tok-123456"\n'
                  '"bearer.auth.logical.cluster" = "lsrc-1"\n"bearer.auth.identity.pool.id" = "pool-1"')
        assert "visits" not in [f.name for f in decoder(load(write_config(tmp_path, r.url, value, bearer)))
                                 .arrow_type]
        bad = write_config(tmp_path, r.url, value, '"basic.auth.user.info" = "svc:wrong-pw"')
        done = globald("check-config", "--config", str(bad))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
        assert "registry.url" in done.stderr and "unauthorized (HTTP 401, error 40101)" in done.stderr
        assert "wrong-pw" not in done.stderr


def test_check_config_says_in_one_line_what_failed(tmp_path: Path, registry: RegistryDouble) -> None:
    registry.register("customers-value", V1)
    good = write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "customers-value"')
    done = globald("check-config", "--config", str(good))
    assert done.returncode == 0, done.stderr
    missing = write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "orders-value"')
    done = globald("check-config", "--config", str(missing))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "tables[0].value.subject: subject not found: 'orders-value'" in done.stderr
    registry.stop()
    done = globald("check-config", "--config", str(good))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "registry.url" in done.stderr and "unreachable" in done.stderr
    # A key the client does not know: refused by the client itself, named.
    unknown = write_config(tmp_path, registry.url, 'subject = "customers-value"\nwriter_schemas = "registry"',
                           '"basic.auth.usr.info" = "svc:pw"')
    done = globald("check-config", "--config", str(unknown))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "registry: Unrecognized properties: basic.auth.usr.info" in done.stderr


def test_secrets_come_from_the_environment_or_a_file_and_are_masked(tmp_path: Path, registry: RegistryDouble,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    registry.users = {"svc": "env-Secret-1"}
    registry.register("customers-value", V1)
    monkeypatch.setenv("SR_AUTH", "svc:env-Secret-1")
    (tmp_path / "token").write_text("tok-File-Secret\n")
    os.chmod(tmp_path / "token", 0o600)
    path = write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "customers-value"',
                        '"basic.auth.user.info" = "env:SR_AUTH"\n"ssl.key.password" = "file:' +
                        str(tmp_path / "token") + '"')
    config = load(path)
    assert config.registry is not None and config.registry["basic.auth.user.info"] == "svc:env-Secret-1"
    assert config.registry["ssl.key.password"] == "tok-File-Secret"
    assert {"svc:env-Secret-1", "env-Secret-1", "tok-File-Secret"} <= set(secret_values(config))
    path.with_name("plain.toml").write_text(path.read_text().replace(
        '"ssl.key.password" = "file:' + str(tmp_path / "token") + '"', ""))
    done = subprocess_env(["check-config", "--json", "--config", str(path.with_name("plain.toml"))],
                          {"SR_AUTH": "svc:env-Secret-1"})
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["registry"]
    assert shown["basic.auth.user.info"] == "***" and shown["url"] == registry.url
    assert "env-Secret-1" not in done.stdout + done.stderr
    monkeypatch.delenv("SR_AUTH")
    with pytest.raises(ConfigError, match=r"registry\.basic\.auth\.user\.info: names the environment variable SR_AUTH"):
        load(path)


def subprocess_env(args: list[str], env: dict[str, str]) -> Any:
    import subprocess
    import sys

    from tests.harness import REPO

    return subprocess.run([sys.executable, "-m", "globald", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, **env})


def test_registry_keys_need_a_registry(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text('state_dir = "s"\n[kafka]\n"bootstrap.servers" = "x:1"\n[[tables]]\nname = "t"\ntopic = "t"\n'
                    '[tables.value]\nformat = "avro"\nframing = "confluent"\nwriter_schemas = "registry"\n'
                    'subject = "t-value"\n')
    with pytest.raises(ConfigError, match=r"tables\[0\].value.subject: needs a \[registry\] table"):
        load(path)
    path.write_text(path.read_text().replace('format = "avro"', 'format = "protobuf"\nmessage = "a.B"')
                    + '[registry]\nurl = "http://h"\n')
    value = load(path).tables[0].value  # every typed format takes its schemas from the registry
    assert value is not None and value.format == "protobuf" and value.writers_from_registry
    path.write_text(path.read_text().replace('message = "a.B"\n', ""))
    with pytest.raises(ConfigError, match=r"tables\[0\].value.message: is required"):
        load(path)  # the reader's message type is named, from a subject as from a file


def test_run_refuses_a_missing_schema_file_at_start_exit_2(tmp_path: Path) -> None:
    path = write_config(tmp_path, "http://127.0.0.1:9", 'writer_schemas = "registry"\nschema = "missing.avsc"')
    done = globald("run", "--config", str(path))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"globald: config error: tables[0].value.schema: cannot read "
                                                f"{tmp_path / 'missing.avsc'}: No such file or directory"]
    assert not (tmp_path / "state").exists()  # nothing touched


CUSTOMER = {"type": "record", "name": "Customer", "namespace": "shop",
            "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}
ORDER = {"type": "record", "name": "Order", "namespace": "shop",
         "fields": [{"name": "total", "type": "double"}, {"name": "lines", "type": "int", "default": 1}]}
ORDER_V1 = {**ORDER, "fields": ORDER["fields"][:1]}


def test_several_record_types_in_one_topic_are_one_struct_field_per_type(tmp_path: Path,
                                                                         registry: RegistryDouble) -> None:
    """TopicRecordNameStrategy: each record type under its own subject; the reader schema a union of them (here
    through references), one struct field per type, exactly one set."""
    customer = registry.register("events-shop.Customer", CUSTOMER)
    order = registry.register("events-shop.Order", ORDER_V1)
    registry.register("events-shop.Order", ORDER)
    registry.register("events-value", ["shop.Customer", "shop.Order"], references=[
        {"name": "shop.Customer", "subject": "events-shop.Customer", "version": 1},
        {"name": "shop.Order", "subject": "events-shop.Order", "version": 2}])
    config = load(write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "events-value"'))
    dec = decoder(config)
    assert dec.arrow_type == pa.struct([("Customer", pa.struct([("id", pa.int64()), ("name", pa.string())])),
                                        ("Order", pa.struct([("total", pa.float64()), ("lines", pa.int32())]))])
    values = pa.array([confluent(customer, avro_bytes(CUSTOMER, {"id": 7, "name": "Ada"})),
                       confluent(order, avro_bytes(ORDER_V1, {"total": 2.5})), None], pa.binary())
    got = dec.decode(values)
    assert got.error_count == 0
    assert python_rows(got.values) == [{"Customer": {"id": 7, "name": "Ada"}, "Order": None},
                                       {"Customer": None, "Order": {"total": 2.5, "lines": 1}}, None]
    # A record of a type the union does not list is a decode error naming it.
    other = registry.register("events-shop.Refund", {**ORDER, "name": "Refund"})
    bad = dec.decode(pa.array([confluent(other, avro_bytes({**ORDER, "name": "Refund"}, {"total": 1.0,
                                                                                          "lines": 2}))]))
    assert bad.error_count == 1 and "Refund" in bad.errors[0].as_py()


def test_a_union_reader_file_reads_records_written_with_the_union_itself(tmp_path: Path) -> None:
    (tmp_path / "events.avsc").write_text(json.dumps(["null", CUSTOMER, ORDER]))
    from globald.settings.typed_spec import ValueFormat

    dec = typed.load(ValueFormat(format="avro", schema=tmp_path / "events.avsc"), "t")
    import fastavro

    union = fastavro.parse_schema(["null", CUSTOMER, ORDER])
    rows = []
    for value in (("shop.Order", {"total": 3.0, "lines": 2}), None):
        import io

        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, union, value)
        rows.append(buf.getvalue())
    got = dec.decode(pa.array(rows, pa.binary()))
    assert got.error_count == 0
    assert python_rows(got.values) == [{"Customer": None, "Order": {"total": 3.0, "lines": 2}}, None]


def test_a_json_schema_reader_from_a_subject(tmp_path: Path, registry: RegistryDouble) -> None:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}}
    sid = registry.register("people-value", json.dumps(schema), kind="JSON")
    path = write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "people-value"')
    path.write_text(path.read_text().replace('format = "avro"', 'format = "json"'))
    dec = decoder(load(path))
    assert dec.arrow_type == pa.struct([("id", pa.int64()), ("name", pa.string())])
    got = dec.decode(pa.array([confluent(sid, b'{"id": 4, "name": "Ada", "x": 1}'), confluent(99, b'{"id": 5}')]))
    assert python_rows(got.values) == [{"id": 4, "name": "Ada"}, {"id": 5, "name": None}] and got.error_count == 0
    assert (tmp_path / "state" / "registry" / "schemas" / f"{sid}.json").exists()


def self_signed(tmp_path: Path, name: str, issuer: tuple[Any, Any] | None = None) -> tuple[str, str, Any, Any]:
    """(certificate file, key file, certificate, key) for 127.0.0.1, signed by ``issuer`` or by itself."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signer_cert, signer_key = issuer if issuer is not None else (None, key)
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject)
               .issuer_name(signer_cert.subject if signer_cert is not None else subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
               .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                              critical=False)
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    cert = builder.sign(signer_key, hashes.SHA256())
    cert_file, key_file = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_file), str(key_file), cert, key


def test_tls_and_client_certificates_the_clients_way(tmp_path: Path) -> None:
    ca_file, _, ca, ca_key = self_signed(tmp_path, "ca")
    server_cert, server_key, _, _ = self_signed(tmp_path, "server", (ca, ca_key))
    client_cert, client_key, _, _ = self_signed(tmp_path, "client", (ca, ca_key))
    with RegistryDouble(tls=(server_cert, server_key), tls_ca=ca_file) as r:
        r.register("customers-value", V1)
        value = 'writer_schemas = "registry"\nsubject = "customers-value"'
        ok = write_config(tmp_path, r.url, value, f'"ssl.ca.location" = "{ca_file}"\n'
                                                  f'"ssl.certificate.location" = "{client_cert}"\n'
                                                  f'"ssl.key.location" = "{client_key}"')
        assert r.url.startswith("https://")
        assert "visits" not in [f.name for f in decoder(load(ok)).arrow_type]
        # Without a client certificate the server refuses the handshake: check-config says so in one line.
        no_cert = write_config(tmp_path, r.url, value, f'"ssl.ca.location" = "{ca_file}"')
        done = globald("check-config", "--config", str(no_cert))
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
        assert "registry.url" in done.stderr and "unreachable" in done.stderr, done.stderr


def test_a_worker_decodes_with_the_reader_schema_its_descriptor_names_after_the_daemon_took_another(
        tmp_path: Path, registry: RegistryDouble) -> None:
    """A job refreshed with version 1 whose worker starts after the daemon took version 2 (a reload mid-job): the
    worker, with no decoder cached, builds version 1's from the descriptor's reader ids, not the daemon's new pin."""
    from globald.spark import typed as spark_typed

    registry.register("customers-value", V1)
    path = write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "customers-value"')
    config = load(path)
    take_reader_schemas(config)
    desc = spark_typed.declaration(str(path), "customers")  # what refresh() puts in the descriptor
    assert desc["reader_ids"] == {"value": 1}
    registry.register("customers-value", V2)
    take_reader_schemas(config)  # the daemon's reload, between the refresh and the task
    spark_typed._DECODERS.clear()  # a fresh Python worker
    key_dec, val_dec = spark_typed.decoders(str(path), "customers", desc["decoder"], desc["reader_ids"])
    assert "visits" not in [f.name for f in val_dec.arrow_type]
    assert spark_typed.file_fingerprint(val_dec, key_dec) == desc["decoder"]
    # The next refresh names version 2, and a job of it reads with version 2.
    new = spark_typed.declaration(str(path), "customers")
    assert new["reader_ids"] == {"value": 2} and new["decoder"] != desc["decoder"]
    after = spark_typed.decoders(str(path), "customers", new["decoder"], new["reader_ids"])[1]
    assert "visits" in [f.name for f in after.arrow_type]


def test_json_schema_references_through_the_registry(tmp_path: Path, registry: RegistryDouble) -> None:
    address = {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"$ref": "#/definitions/zip"}},
               "definitions": {"zip": {"type": "string"}}}
    registry.register("address", json.dumps(address), kind="JSON")
    person = {"type": "object", "properties": {"id": {"type": "integer"}, "home": {"$ref": "address.json"}}}
    sid = registry.register("people-value", json.dumps(person), kind="JSON",
                            references=[{"name": "address.json", "subject": "address", "version": 1}])
    path = write_config(tmp_path, registry.url, 'writer_schemas = "registry"\nsubject = "people-value"')
    path.write_text(path.read_text().replace('format = "avro"', 'format = "json"'))
    dec = decoder(load(path))
    assert dec.arrow_type == pa.struct([("id", pa.int64()), ("home", pa.struct([("city", pa.string()),
                                                                               ("zip", pa.string())]))])
    got = dec.decode(pa.array([confluent(sid, b'{"id": 1, "home": {"city": "Oslo", "zip": "0150"}}')]))
    assert python_rows(got.values) == [{"id": 1, "home": {"city": "Oslo", "zip": "0150"}}]


def test_a_registry_started_at_an_earlier_ones_port_is_not_answered_from_its_cache() -> None:
    """The OS hands a closed registry's port to the next test's: the client this process keeps per URL must not
    answer schema ids from the first registry's cache (a protobuf table once read id 2 as another test's Avro)."""
    from globald.typed.registry_http import client

    with RegistryDouble() as first:
        sid = first.register("a-value", '{"type": "string"}')
        port = first.port
        assert client({"url": first.url}).get_schema(sid).schema_type == "AVRO"
    second = RegistryDouble()
    second.port = port
    with second:
        assert second.register("b-value", '{"type": "long"}') == sid
        assert client({"url": second.url}).get_schema(sid).schema_str == '{"type": "long"}'
