"""Pure logic and the real RocksDB store without a broker: encoding, .checkpoint files, states, imports."""

from __future__ import annotations

from pathlib import Path

import pytest

from globald.common.errors import StoreCorruptError, StoreIOError
from globald.common.states import IllegalTransition, State, StateMachine
from globald.store import checkpoint_file
from globald.store.codec import decode_value, encode_value
from globald.store.failures import classify, out_of_space
from globald.store.names import checkpoint_path, db_dir
from globald.store.options import StoreOptions
from globald.store.reader import StoreReader
from globald.store.table_store import TableStore
from tests.layouts import write_plain_store
from tests.stores import write_records


def test_value_encoding_round_trip() -> None:
    assert encode_value(-1, b"v") == b"\xff" * 8 + b"v"
    assert decode_value(encode_value(1_700_000_000_000, b"")) == (b"", 1_700_000_000_000)
    with pytest.raises(ValueError):
        decode_value(b"short")


def test_checkpoint_file_round_trip_and_rejects_garbage(tmp_path: Path) -> None:
    path = tmp_path / ".checkpoint"
    checkpoint_file.write(path, {("t", 1): 10, ("t", 0): 5})
    assert path.read_text() == "0\n2\nt 0 5\nt 1 10\n"
    assert checkpoint_file.read(path) == {("t", 0): 5, ("t", 1): 10}
    for garbage in ["", "0\n", "1\n0\n", "0\n2\nt 0 5\n", "0\n1\nt x 5\n", "0\n1\nt 0 -5\n", "\x00\xff"]:
        path.write_text(garbage)
        with pytest.raises(checkpoint_file.CheckpointFormatError):
            checkpoint_file.read(path)
    assert checkpoint_file.read(tmp_path / "missing") == {}


def test_transition_table_is_enforced() -> None:
    m = StateMachine(lambda *event: None)
    with pytest.raises(IllegalTransition):
        m.to(State.RUNNING, "skipping restore")
    assert m.to(State.RESTORING, "start")
    assert not m.to(State.RESTORING, "again")
    m.to(State.RUNNING, "done")
    m.to(State.PENDING_SHUTDOWN, "stop")
    m.to(State.NOT_RUNNING, "stopped")
    with pytest.raises(IllegalTransition):
        m.to(State.RESTORING, "after death")


def test_offsets_are_written_with_data_and_checkpoint_imported_on_first_open(tmp_path: Path) -> None:
    # A store of an older globald: data, no offsets inside, a .checkpoint beside it.
    write_plain_store(db_dir(tmp_path, "tbl"), {b"old": b"1"})
    checkpoint_file.write(_mkdirs(checkpoint_path(tmp_path, "tbl")), {("topic", 0): 42, ("other", 0): 7})
    opened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert opened.imported == {0: 42} and opened.wiped_reason is None and not opened.crashed
    store = opened.store
    write_records(store, {b"k": encode_value(-1, b"v")}, {0: 43})
    with StoreReader(store.path) as r:  # a read-only open beside the live owner
        assert r.offsets() == {0: 43} and r.get(b"k") == (b"v", -1)
    store.close(clean=False)  # as after a crash
    reopened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert reopened.crashed and reopened.imported == {}
    assert reopened.store.offsets() == {0: 43}
    reopened.store.close()
    again = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert not again.crashed
    again.store.wipe()
    assert again.store.offsets() == {}
    again.store.close()


def test_checkpoint_file_beside_a_store_without_data_is_not_imported(tmp_path: Path) -> None:
    # The database was deleted (or a wipe died after removing it) but the .checkpoint file survived.
    checkpoint_file.write(_mkdirs(checkpoint_path(tmp_path, "tbl")), {("topic", 0): 42})
    opened = TableStore.open(tmp_path, "tbl", "topic", StoreOptions())
    assert opened.imported == {} and opened.store.offsets() == {}
    opened.store.close()


def test_store_of_another_topic_is_wiped(tmp_path: Path) -> None:
    TableStore.open(tmp_path, "tbl", "a", StoreOptions()).store.close()
    opened = TableStore.open(tmp_path, "tbl", "b", StoreOptions())
    assert opened.wiped_reason and "topic" in opened.wiped_reason
    opened.store.close()


def _mkdirs(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_errors_are_classified_once_corrupt_apart_from_a_disk_that_may_heal() -> None:
    assert isinstance(classify(Exception("Corruption: block checksum mismatch"), "read"), StoreCorruptError)
    full = classify(Exception("IO error: No space left on device"), "write")
    assert isinstance(full, StoreIOError) and str(full) == "write: IO error: No space left on device"
    assert out_of_space(full) and out_of_space(OSError(28, "No space left on device"))
    assert not out_of_space(StoreIOError("write: IO error: Input/output error")) and not out_of_space(OSError(5, "x"))

