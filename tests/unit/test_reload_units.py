"""Pure parts of live reconfiguration: what a reload changes (``settings.changes``), and how the status document
and /metrics carry the config in force (``status.document.ConfigStatus``, ``ops.metrics``)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from globald.common.states import State
from globald.ops.metrics import Metrics, Sample
from globald.settings.changes import changes, delta, refusal
from globald.settings.config import SnapshotConfig, parse
from globald.status.document import ConfigStatus, DaemonStatus
from globald.status.statusfile import status_lines

BASE = {"state_dir": "/srv/state", "kafka": {"bootstrap.servers": "127.0.0.1:9092"},
        "tables": [{"name": "a", "topic": "ta"}, {"name": "b", "topic": "tb"}]}


def test_live_keys_are_applied_and_the_first_fixed_one_refuses_the_whole_reload() -> None:
    old = parse(BASE)
    new = replace(old, commit_interval_ms=300, snapshots=SnapshotConfig(retain=9),
                  kafka={**old.kafka, "client.id": "x"})
    found = changes(old, new)
    assert [c.key for c in found] == ["kafka.client.id", "commit_interval_ms", "snapshots.retain"]
    assert refusal(found) is None
    moved = replace(new, state_dir=Path("/srv/other"), allocator="glibc")
    line = refusal(changes(old, moved))
    assert line is not None and "\n" not in line
    assert line.startswith("state_dir: cannot change while the daemon runs") and "1 other key" in line


def test_a_table_added_dropped_or_changed_is_named_and_reordering_is_no_change() -> None:
    old = parse(BASE)
    assert changes(old, replace(old, tables=old.tables[::-1])) == []
    new = parse({**BASE, "tables": [BASE["tables"][0], {"name": "c", "topic": "tc"}]})
    found = changes(old, new)
    assert [c.key for c in found] == ["tables.b", "tables.c"]
    d = delta(old, new)
    assert d.dropped == ("b",) and d.added == (new.table("c"),) and d.replaced == d.redeclared == ()
    assert refusal(found) is None and d.refusal is None  # added and dropped live
    moved = parse({**BASE, "tables": [BASE["tables"][0], {"name": "b", "topic": "tc"}]})
    assert refusal(changes(old, moved)) is None and changes(old, moved)[0].replaced  # another topic: replaced


def test_the_config_status_round_trips_and_reaches_the_metrics() -> None:
    status = ConfigStatus(3, "ab" * 32, "/etc/globald/globald.toml",
                          {"time": 1_700_000_000.5, "result": "refused", "error": "state_dir: cannot change"})
    doc = DaemonStatus(State.RUNNING, 42, {}, config=status)
    assert DaemonStatus.from_json(doc.to_json()).config == status
    config = [line for line in status_lines(doc) if line.startswith("  config:")]
    assert len(config) == 1 and config[0].startswith(f"  config: generation 3, sha256 {'ab' * 32}; last reload ")
    assert config[0].endswith(" refused: state_dir: cannot change"), config
    assert DaemonStatus.from_json({"state": "RUNNING", "config": {"generation": "x"}}).config is None
    text = Metrics(lambda: Sample(doc=doc), lambda: (0.0, 0.0)).render().decode()
    assert "globald_config_generation 3.0" in text
    assert "globald_config_last_reload_timestamp_seconds 1.7000000005e+09" in text
    assert 'globald_config_last_reload_result{result="refused"} 1.0' in text
    assert 'globald_config_last_reload_result{result="applied"} 0.0' in text


def test_a_typed_table_redeclared_in_place_is_live_and_a_change_of_typedness_or_topic_replaces_it() -> None:
    def with_b(**b: object) -> dict[str, object]:
        return {**BASE, "tables": [BASE["tables"][0], {"name": "b", "topic": "tb", **b}]}

    v1 = {"format": "avro", "schema": "/schemas/v1.avsc"}
    old = parse(with_b(value=v1))
    for new_b in ({"value": {**v1, "schema": "/schemas/v2.avsc"}}, {"value": {**v1, "on_error": "fail"}},
                  {"value": v1, "key": {"format": "json", "schema": "/schemas/k.json"}}):
        found = changes(old, parse(with_b(**new_b)))
        d = delta(old, parse(with_b(**new_b)))
        assert [c.key for c in found] == ["tables.b"] and d.added == d.replaced == d.dropped == ()
        assert found[0].redeclared == parse(with_b(**new_b)).table("b") and d.redeclared == (found[0].redeclared,)
        assert refusal(found) is None
    for new_b in ({}, {"value": v1, "topic": "tc"}):  # typed -> raw, another topic: replaced, not in place
        new = parse(with_b(**new_b))
        found = changes(old, new)
        assert found[0].redeclared is None and found[0].replaced and refusal(found) is None
        d = delta(old, new)  # dropped and added in one reload, under the same name
        assert d.replaced == (new.table("b"),) and d.added == d.dropped == d.redeclared == ()
        assert d.stores_dropped == ("b",) and d.stores_added == (new.table("b"),)
    raw_to_typed = changes(parse(BASE), old)
    assert raw_to_typed[0].redeclared is None and raw_to_typed[0].replaced and refusal(raw_to_typed) is None


def test_a_delta_names_each_table_change_once_and_whether_kafka_changed() -> None:
    """One reload that adds, drops, replaces and redeclares a table and changes [kafka]: each table in exactly one
    of the delta's lists, in the config's order; the stores dropped and added are those the engine acts on."""
    v1 = {"format": "avro", "schema": "/schemas/v1.avsc"}
    old = parse({**BASE, "tables": [{"name": "a", "topic": "ta"}, {"name": "b", "topic": "tb"},
                                    {"name": "t", "topic": "tt", "value": v1}]})
    new = parse({**BASE, "kafka": {**BASE["kafka"], "client.id": "x"},
                 "tables": [{"name": "c", "topic": "tc"}, {"name": "b", "topic": "tb2"},
                            {"name": "t", "topic": "tt", "value": {**v1, "schema": "/schemas/v2.avsc"}}]})
    d = delta(old, new)
    assert d.config is new and d.kafka_changed and d.refusal is None
    assert d.added == (new.table("c"),) and d.dropped == ("a",)
    assert d.replaced == (new.table("b"),) and d.redeclared == (new.table("t"),)
    assert d.stores_dropped == ("a", "b") and d.stores_added == (new.table("c"), new.table("b"))
    assert d.keys == "kafka.client.id, tables.a, tables.b, tables.t, tables.c"
    same = delta(old, replace(old, tables=old.tables[::-1]))
    assert not same.kafka_changed and same.changes == () and same.keys == "nothing changed"
    assert same.added == same.dropped == same.replaced == same.redeclared == ()
    assert delta(old, replace(old, commit_interval_ms=7)).kafka_changed is False
    removed = replace(old, kafka={})  # a property gone is a [kafka] change too
    assert delta(old, removed).kafka_changed and delta(removed, old).kafka_changed
    fixed = delta(old, replace(old, state_dir=Path("/srv/other")))
    assert fixed.refusal is not None and fixed.refusal.startswith("state_dir: cannot change")
