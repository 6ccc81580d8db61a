"""The one mechanism of the two file-based request protocols (``globald.status.file_requests``): a request is taken
or withdrawn, never both; it is size-capped JSON; its answer is collected once. Each protocol is checked through
its own module, so that both are shown to use it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from globald.ops import operator_requests
from globald.snapshot import exact_requests
from globald.snapshot.exact_requests import Code, Response
from globald.snapshot.manifest import MAX_JSON_BYTES
from globald.status import file_requests
from globald.store.names import SNAPSHOT_REQUESTS_DIR, snapshots_dir


def test_a_request_is_taken_or_withdrawn_never_both(tmp_path: Path) -> None:
    file_requests.post(tmp_path / "a.json", {"n": 1})
    file_requests.post(tmp_path / "b.json", {"n": 2})
    (tmp_path / ".c.json").write_text("{}")  # being written: not a request yet
    assert file_requests.pending(tmp_path) == ["a.json", "b.json"]
    taken = file_requests.claim(tmp_path, "a.json")
    assert taken is not None and file_requests.read(taken, 100) == {"n": 1}
    assert not file_requests.withdraw(tmp_path / "a.json")  # too late: the daemon has it
    assert file_requests.claim(tmp_path, "a.json") is None  # and nobody takes it twice
    assert file_requests.withdraw(tmp_path / "b.json")
    assert file_requests.claim(tmp_path, "b.json") is None  # withdrawn: never taken
    assert file_requests.pending(tmp_path) == []


def test_a_request_is_size_capped_json_object(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    for raw, error in ((b"x" * 101, "too large"), (b"{garbage", "not JSON"), (b"[1]", "not a JSON object"),
                       (b"\xff\xfe", "not JSON")):
        path.write_bytes(raw)
        with pytest.raises(ValueError, match=error):
            file_requests.read(path, 100)


def test_an_answer_is_collected_once(tmp_path: Path) -> None:
    path = tmp_path / "t.done"
    assert file_requests.collect(path, 100) is None
    file_requests.post(path, {"ok": True})
    assert file_requests.collect(path, 100) == {"ok": True}
    assert not path.exists() and file_requests.collect(path, 100) is None
    path.write_bytes(b"{half")
    with pytest.raises(ValueError):
        file_requests.collect(path, 100)
    assert not path.exists()  # an unreadable answer is not read again and again


def test_an_exact_request_is_claimed_and_an_oversized_one_refused(tmp_path: Path) -> None:
    good = exact_requests.submit(tmp_path, "tbl", {0: 5})
    folder = snapshots_dir(tmp_path, "tbl") / SNAPSHOT_REQUESTS_DIR
    (folder / "rbig.json").write_bytes(json.dumps({"id": "rbig", "pad": "x" * MAX_JSON_BYTES}).encode())
    gone = exact_requests.submit(tmp_path, "tbl", {0: 6})
    exact_requests._withdraw(folder, gone)  # the reader gave up before the daemon looked
    taken = exact_requests.take_pending(tmp_path, "tbl")
    assert [t.id if isinstance(t, exact_requests.Request) else t.request for t in taken] == sorted(["rbig", good.id])
    (refused,) = (t for t in taken if isinstance(t, Response))
    assert isinstance(refused, Response) and refused.code == Code.INVALID and "too large" in refused.message
    assert list(folder.iterdir()) == []  # nothing left behind: no request, no claim


def test_an_operator_request_that_is_not_json_is_answered_so(tmp_path: Path) -> None:
    inbox = operator_requests.RequestInbox(tmp_path, None, lambda table, why: None)  # type: ignore[arg-type,return-value]
    inbox.open()
    folder = operator_requests.requests_dir(tmp_path)
    (folder / "reset-abc.json").write_bytes(b"{not json")
    (folder / "reset-big.json").write_bytes(b"{" + b" " * operator_requests.MAX_REQUEST_BYTES + b"}")
    inbox.poll()
    assert json.loads((folder / "abc.done").read_text()) == {"ok": False, "error": "request is not JSON"}
    assert "too large" in json.loads((folder / "big.done").read_text())["error"]
    assert sorted(p.name for p in folder.iterdir()) == ["abc.done", "big.done"]
