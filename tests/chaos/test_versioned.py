"""The versioned lane's plan, config and records (``tests.chaos.versioned``), without a daemon or a broker: cheap.
The lane itself runs in ``make chaos`` (a seed's setup and one event take ~40 s, beyond the CI form's budget)."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

from globald.settings.config import load
from tests.chaos import plan
from tests.chaos.versioned import SKIPPED, TimedAdmin, VersionedConfig, lane_plan


def test_the_lanes_plan_skips_what_tansu_cannot_take_and_wipes_once_per_seed() -> None:
    for seed in range(1, 6):
        events = lane_plan(seed, 5, 3)
        assert [e.index for e in events] == list(range(9))
        kinds = Counter(e.kind for e in events)
        assert not set(kinds) & (set(SKIPPED) - {plan.RECREATE}), kinds
        wipe = [e for e in events if e.kind == plan.RECREATE]
        assert len(wipe) == 1 and wipe[0].phase == plan.START and wipe[0].params["when"] == "before-start"
        assert [e.kind in plan.RELOAD_KINDS for e in events] == [False] * 6 + [True] * 3
        assert lane_plan(seed, 5, 3) == events  # a function of the seed: --only-fault replays it


def test_the_config_declares_history_on_the_tables_that_have_it(tmp_path: Path) -> None:
    cfg = VersionedConfig(tmp_path / "globald.toml", tmp_path / "state", {"bootstrap.servers": "127.0.0.1:1"},
                          {plan.BULK: "t-bulk", plan.SMALL: "t-small"}, 0)
    loaded = load(cfg.write())
    assert {t.name: t.history for t in loaded.tables} == {plan.BULK: 3_600_000, plan.SMALL: None}
    cfg.history = {plan.BULK: "2m", plan.SMALL: "1h"}
    loaded = load(cfg.write(live={"commit_interval_ms": 800}))
    assert {t.name: t.history for t in loaded.tables} == {plan.BULK: 120_000, plan.SMALL: 3_600_000}
    assert loaded.commit_interval_ms == 800


def test_records_are_stamped_out_of_order_with_ties_and_keep_their_tombstones() -> None:
    admin = TimedAdmin({"bootstrap.servers": "127.0.0.1:1"}, seed=3)
    plain = [(b"k%d" % (i % 50), None if i % 10 == 0 else b"v%d" % i) for i in range(2_000)]
    stamped = admin._stamp([*plain, (b"given", b"v", 5, None)])
    assert stamped[-1] == (b"given", b"v", 5, None)  # a record with its own time keeps it
    stamps = [ts for _, _, ts, _ in stamped[:-1] if ts is not None]
    assert any(b < a for a, b in itertools.pairwise(stamps))  # out of order
    assert sum(1 for r in stamped if r[1] is None) == 200  # every tombstone kept
    ties = [(a, b) for a, b in itertools.pairwise(stamped) if b[1] and b[1].startswith(b"tie-")]
    assert ties and all(a[0] == b[0] and a[2] == b[2] for a, b in ties)  # same key, same time, later offset
