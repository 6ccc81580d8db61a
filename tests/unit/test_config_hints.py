"""Config errors that point at the fix (issue 42, item 7): an unquoted dotted property is answered with how to quote
it, a misspelt librdkafka property with the nearest real one; still one line naming the key, exit 2."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from globald.settings.librdkafka_names import PROPERTY_NAMES
from tests.harness import globald

CONFIG = """state_dir = "{state}"
[kafka]
{kafka}
[[tables]]
name = "customers"
topic = "customers"
"""


def check_config(tmp_path: Path, kafka: str, extra: str = "") -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "g.toml"
    cfg.write_text(CONFIG.format(state=tmp_path / "state", kafka=kafka) + extra)
    return globald("check-config", "--config", str(cfg))


def error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    return lines[0]


def test_an_unquoted_dotted_kafka_key_is_answered_with_how_to_quote_it(tmp_path: Path) -> None:
    r = check_config(tmp_path, 'bootstrap.servers = "127.0.0.1:9"')
    assert error_line(r) == ('globald: config error: kafka.bootstrap: an unquoted dotted key: write '
                             '"bootstrap.servers" = ... (TOML reads bootstrap.servers = ... as a table)')


def test_a_deeper_unquoted_key_names_the_whole_property(tmp_path: Path) -> None:
    r = check_config(tmp_path, '"bootstrap.servers" = "127.0.0.1:9"\nfetch.wait.max.ms = 100')
    assert error_line(r) == ('globald: config error: kafka.fetch: an unquoted dotted key: write '
                             '"fetch.wait.max.ms" = ... (TOML reads fetch.wait.max.ms = ... as a table)')


def test_an_unquoted_dotted_registry_key_is_answered_the_same_way(tmp_path: Path) -> None:
    r = check_config(tmp_path, '"bootstrap.servers" = "127.0.0.1:9"',
                     '[registry]\nurl = "http://127.0.0.1:9"\nbasic.auth.user.info = "env:NOPE"\n')
    assert error_line(r) == ('globald: config error: registry.basic: an unquoted dotted key: write '
                             '"basic.auth.user.info" = ... (TOML reads basic.auth.user.info = ... as a table)')


def test_a_value_of_the_wrong_type_is_not_mistaken_for_a_dotted_key(tmp_path: Path) -> None:
    r = check_config(tmp_path, '"bootstrap.servers" = ["127.0.0.1:9"]')
    assert error_line(r) == ("globald: config error: kafka.bootstrap.servers: librdkafka properties must be strings, "
                             "numbers or booleans")


def test_a_misspelt_librdkafka_property_is_answered_with_the_nearest_one(tmp_path: Path) -> None:
    r = check_config(tmp_path, '"bootstrap.servers" = "127.0.0.1:9"\n"fetch.wait.max.msec" = 100')
    assert error_line(r) == ('globald: config error: kafka.fetch.wait.max.msec: No such configuration property: '
                             '"fetch.wait.max.msec" (did you mean "fetch.wait.max.ms"?)')


def test_an_unknown_property_near_no_real_one_gets_no_guess(tmp_path: Path) -> None:
    r = check_config(tmp_path, '"bootstrap.servers" = "127.0.0.1:9"\n"no.such.property" = 1')
    assert error_line(r) == ('globald: config error: kafka.no.such.property: No such configuration property: '
                             '"no.such.property"')


def test_the_quoted_properties_pass(tmp_path: Path) -> None:
    r = check_config(tmp_path, '"bootstrap.servers" = "127.0.0.1:9"\n"fetch.wait.max.ms" = 100',
                     '[registry]\nurl = "http://127.0.0.1:9"\n"basic.auth.user.info" = "u:p"\n')
    # The registry is not there: the config itself passed, and check-config went on to ask the registry.
    assert "unquoted" not in r.stderr and "No such configuration property" not in r.stderr, r.stderr
    r = check_config(tmp_path, '"bootstrap.servers" = "127.0.0.1:9"\n"fetch.wait.max.ms" = 100')
    assert r.returncode == 0 and "OK" in r.stdout, (r.stdout, r.stderr)


def _installed_librdkafka() -> ctypes.CDLL:
    """The librdkafka confluent_kafka loaded (its wheel bundles it); the test is skipped where it cannot be found."""
    import confluent_kafka

    bundled = sorted((Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs").glob("librdkafka*"))
    if not bundled:
        pytest.skip("confluent_kafka's bundled librdkafka not found (a system librdkafka build)")
    lib = ctypes.CDLL(str(bundled[0]))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_size_t]
    for kind in ("conf", "topic_conf"):
        getattr(lib, f"rd_kafka_{kind}_dump").restype = ctypes.POINTER(ctypes.c_char_p)
        getattr(lib, f"rd_kafka_{kind}_dump").argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
    lib.rd_kafka_topic_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_topic_conf_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_dump_free.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    return lib


def test_every_suggested_name_is_a_property_of_the_installed_librdkafka() -> None:
    lib = _installed_librdkafka()
    unknown_property = -2  # RD_KAFKA_CONF_UNKNOWN; an invalid value (-1) still means the name exists
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    try:
        unknown = [n for n in PROPERTY_NAMES
                   if lib.rd_kafka_conf_set(conf, n.encode(), b"x", error, len(error)) == unknown_property]
    finally:
        lib.rd_kafka_conf_destroy(conf)
    assert unknown == []


def test_the_names_cover_every_property_the_installed_librdkafka_reports() -> None:
    """rd_kafka_conf_dump lists the properties that have a value by default (not the aliases nor callbacks): a
    librdkafka upgrade adding one fails here, and librdkafka_names.py is updated from its CONFIGURATION.md."""
    lib = _installed_librdkafka()
    reported: set[str] = set()
    for kind in ("conf", "topic_conf"):
        conf = getattr(lib, f"rd_kafka_{kind}_new")()
        count = ctypes.c_size_t()
        pairs = getattr(lib, f"rd_kafka_{kind}_dump")(conf, ctypes.byref(count))
        reported |= {pairs[i].decode() for i in range(0, count.value, 2)}
        lib.rd_kafka_conf_dump_free(pairs, count)
        getattr(lib, f"rd_kafka_{kind}_destroy")(conf)
    callbacks = {n for n in reported if n.endswith("_cb") or n == "enable_sasl_queue"}  # set through their own API
    assert sorted(reported - callbacks - set(PROPERTY_NAMES)) == []
