"""What may be printed of the config (an allowlist of librdkafka properties, everything else masked), the log
masker that hides the rest, and the refusal of a non-loopback HTTP bind without an explicit opt-in."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from globald.common.errors import ConfigError
from globald.common.logs import JsonFormatter, PlainFormatter, Redactor
from globald.ops.health import Liveness
from globald.ops.http import Endpoints, HttpServer
from globald.settings.config import HttpConfig, is_loopback, load
from globald.settings.kafka_properties import (
    CONSUMER_DEFAULTS,
    MANAGED_KAFKA_PROPERTIES,
    printable,
    redact,
    secret_values,
)

# Properties that carry a credential, or may: none may ever be printed, whatever its name looks like.
CREDENTIALS = [
    "sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.key.pem", "sasl.oauthbearer.config",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.extensions", "sasl.oauthbearer.token.endpoint.url", "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.oauthbearer.assertion.private.key.passphrase", "sasl.kerberos.kinit.cmd", "ssl.certificate.pem",
    "ssl.ca.pem", "ssl_key", "plugin.library.paths", "no.such.property", "SASL.USERNAME", "bootstrap.servers.x",
    "my.client.secret", "",
]
# Properties an operator needs to read back, none of which can hold a credential.
HARMLESS = [
    "bootstrap.servers", "client.id", "group.id", "security.protocol", "sasl.mechanism", "sasl.mechanisms",
    "sasl.username", "api.version.request", "broker.version.fallback", "fetch.wait.max.ms", "fetch.max.bytes",
    "queued.max.messages.kbytes", "session.timeout.ms", "socket.timeout.ms", "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification", "isolation.level", "ssl.ca.location", "debug", "statistics.interval.ms",
]


@pytest.mark.parametrize("name", CREDENTIALS)
def test_credential_properties_are_never_printable(name: str) -> None:
    assert not printable(name)
    assert redact({name: "v-Qv8"}) == {name: "***"}


@pytest.mark.parametrize("name", HARMLESS)
def test_harmless_properties_are_printable(name: str) -> None:
    assert printable(name)
    assert redact({name: "v"}) == {name: "v"}


def test_what_globald_sets_itself_is_printable() -> None:
    # The consumer-settings echo shows these on every start: masking them would hide nothing and help nobody.
    assert all(printable(k) for k in [*MANAGED_KAFKA_PROPERTIES, *CONSUMER_DEFAULTS, "group.id", "client.id"])


def _config(tmp_path: Path, kafka: str, extra: str = "") -> Path:
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'state_dir = "{tmp_path / "state"}"\n{extra}\n[kafka]\n"bootstrap.servers" = "b:1"\n{kafka}\n'
                   '[[tables]]\nname = "t"\ntopic = "t"\n')
    return cfg


def test_secret_values_are_every_non_printable_value_and_the_webhook_password(tmp_path: Path) -> None:
    cfg = load(_config(tmp_path, '"ssl.key.pem" = "pem-Qv8"\n"sasl.oauthbearer.config" = "principal=a x=cfg-Qv8"\n'
                                 '"sasl.username" = "alice"\n"socket.timeout.ms" = 5000\n',
                       '[hooks]\nwebhook_url = "https://u:hook-Qv8@example.com/x"'))
    assert sorted(secret_values(cfg)) == ["hook-Qv8", "pem-Qv8", "principal=a x=cfg-Qv8"]


def test_masker_hides_values_and_the_tails_librdkafka_quotes() -> None:
    pem = "-----BEGIN KEY-----\nAAAA-Qv8\n-----END KEY-----"
    redact_text = Redactor(["principal=admin extension_trace=cfg-Qv8", pem])
    quoted = "Failed to acquire token: Unrecognized sasl.oauthbearer.config beginning at: extension_trace=cfg-Qv8"
    assert "Qv8" not in redact_text(quoted) and redact_text(quoted).endswith("beginning at: ***")
    assert "Qv8" not in redact_text(repr(pem)) and "Qv8" not in redact_text(json.dumps(pem))


@pytest.mark.parametrize("value", ["true", "False", "5000", "-1", "0.5", "ssl", "abc", "", "   "])
def test_masker_leaves_short_values_booleans_and_numbers_alone(value: str) -> None:
    # A non-printable property set to such a value must not turn every "true" or "5000" of the log into ***.
    line = "socket.timeout.ms 5000 enable true ssl abc False -1 0.5 ok"
    assert Redactor([value])(line) == line


@pytest.mark.parametrize("formatter", [PlainFormatter, JsonFormatter])
def test_log_line_masks_a_non_printable_value_echoed_by_a_library(formatter: type[logging.Formatter]) -> None:
    line = formatter(Redactor(["opaque-token-Qv8"])).format(  # type: ignore[call-arg]
        logging.LogRecord("globald.librdkafka", logging.WARNING, "", 0, "AUTH %s", ("opaque-token-Qv8 refused",),
                          None))
    assert "Qv8" not in line and "*** refused" in line


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "localhost", "LOCALHOST", "::ffff:127.0.0.1"])
def test_loopback_hosts(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "example.com", "localhost.example",
                                  "::ffff:10.0.0.1", "[::1]"])
def test_non_loopback_hosts(host: str) -> None:
    assert not is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "myhost"])
def test_non_loopback_http_host_needs_the_opt_in(tmp_path: Path, host: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(_config(tmp_path, "", f'[http]\nhost = "{host}"'))
    assert e.value.key == "http.host" and "allow_non_loopback" in str(e.value)
    cfg = load(_config(tmp_path, "", f'[http]\nhost = "{host}"\nallow_non_loopback = true'))
    assert cfg.http.host == host and cfg.http.allow_non_loopback


def test_loopback_or_disabled_http_needs_no_opt_in(tmp_path: Path) -> None:
    assert load(_config(tmp_path, "")).http == HttpConfig(host="127.0.0.1", allow_non_loopback=False)
    assert load(_config(tmp_path, "", '[http]\nhost = "::1"')).http.host == "::1"
    assert not load(_config(tmp_path, "", '[http]\nenabled = false\nhost = "0.0.0.0"')).http.enabled


def test_opt_in_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load(_config(tmp_path, "", '[http]\nhost = "0.0.0.0"\nallow_non_loopback = "yes"'))
    assert e.value.key == "http.allow_non_loopback"


def _endpoints() -> Endpoints:
    return Endpoints(lambda: b"", lambda: None, lambda: Liveness(True, "ok", 0.0, 0.0))


def test_http_server_warns_when_bound_beyond_loopback(caplog: pytest.LogCaptureFixture) -> None:
    for host, warned in (("127.0.0.1", False), ("0.0.0.0", True)):
        caplog.clear()
        server = HttpServer(HttpConfig(host=host, port=0, allow_non_loopback=True), _endpoints())
        with caplog.at_level(logging.INFO, logger="globald.ops.http"):
            server.start()
            server.announce()  # said once the daemon has started, not at the bind (a refused start is one line)
            server.stop()
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert bool(warnings) == warned, warnings
        assert all("unauthenticated" in w and "allow_non_loopback" in w for w in warnings)
