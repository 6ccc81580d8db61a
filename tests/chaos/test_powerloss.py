"""CI form of the chaos campaign's power-loss lane (tests/chaos/powerloss.py): one seed, one cut in each phase.

Each cut SIGKILLs the daemon at a random moment of its phase and mounts a copy of its disk image in place of the
disk; the copy must hold whole stores, ``.checkpoint`` files, snapshots and CURRENT equal to the oracle, and a daemon
started on it must recover by itself. ``make chaos`` runs the long form (5 seeds of 12 cuts);
``GLOBALD_POWERLOSS_SEED`` replays another seed here. Needs root for loop devices: skipped otherwise (failed in CI).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos import powerloss, runner
from tests.ci import unavailable

SEED = int(os.environ.get("GLOBALD_POWERLOSS_SEED", "3"))


def test_make_chaos_cuts_fifty_times_over_five_seeds_in_every_phase() -> None:
    args = runner.parse([])
    assert args.powerloss_seeds >= 5 and args.powerloss_seeds * args.powerloss_cuts >= 50
    assert args.powerloss_cuts >= 2 * len(powerloss.PHASES)  # each phase at least twice per seed


@pytest.mark.long
@pytest.mark.kafka
@pytest.mark.timeout(600)
def test_short_seeded_power_loss_lane(tmp_path: Path) -> None:
    if os.environ.get("GLOBALD_TEST_BOOTSTRAP"):
        pytest.skip("the lane runs its own embedded broker")
    why = powerloss.why_not()
    if why is not None:
        unavailable(f"power-loss lane: {why}", fail_as_root=True)
    lane = powerloss.run(SEED, 1, len(powerloss.PHASES), tmp_path / "report")
    report = (tmp_path / "report" / "powerloss.md").read_text()
    assert lane.ok(), report
    assert {c.phase for c in lane.cuts} == set(powerloss.PHASES), report
    assert all(c.stores >= 1 and c.currents == 2 for c in lane.cuts), report
