"""The reliability suite's store check fails when it could not compare: "0 divergences" must mean read and equal."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from globald.store.names import db_dir
from tests.harness import Broker
from tests.reliability.checks import NotCompared, check_store

NO_BROKER = cast(Broker, None)  # a store that cannot be read is judged before the broker is asked anything


def test_a_missing_store_is_not_a_store_without_divergences(tmp_path: Path) -> None:
    with pytest.raises(NotCompared, match="no store on disk"):
        check_store(NO_BROKER, tmp_path, "tbl", "topic")
    check = check_store(NO_BROKER, tmp_path, "tbl", "topic", allow_uncompared=True)
    assert not check.compared and not check.readable and check.divergences == 0


def test_an_unreadable_store_is_not_a_store_without_divergences(tmp_path: Path) -> None:
    db = db_dir(tmp_path, "tbl")
    db.mkdir(parents=True)
    (db / "CURRENT").write_text("MANIFEST-000099\n")  # names a manifest that is not there
    with pytest.raises(NotCompared):
        check_store(NO_BROKER, tmp_path, "tbl", "topic")
    assert not check_store(NO_BROKER, tmp_path, "tbl", "topic", allow_uncompared=True).compared
