"""tests.soak_report: the RSS slope's interval must cover the true slope, and not claim a slope where there is none."""

from __future__ import annotations

import random

from tests import soak_report


def _series(slope_mb_per_hour: float, minutes: int, noise: float, seed: int) -> list[tuple[float, float]]:
    rnd = random.Random(seed)
    return [(t, 60 + slope_mb_per_hour * t / 3600 + rnd.gauss(0, noise)) for t in range(0, minutes * 60, 5)]


def test_t_quantile_matches_the_table() -> None:
    for df, table in ((5, 2.571), (10, 2.228), (28, 2.048), (1000, 1.962)):
        assert abs(soak_report.t975(df) - table) < 0.015


def test_the_interval_after_warmup_covers_the_slope_and_excludes_zero() -> None:
    fit = soak_report.slope_after_warmup(_series(6.0, 45, 0.3, seed=1), 45 * 60)
    assert fit["warmup_min"] == 15 and fit["minutes_fitted"] == 30
    assert fit["ci95_low"] < 6.0 < fit["ci95_high"] and fit["ci95_low"] > 0


def test_a_flat_series_with_a_warmup_ramp_gives_an_interval_around_zero() -> None:
    samples = [(t, m + (20 * (1 - t / 900) if t < 900 else 0)) for t, m in _series(0.0, 45, 0.3, seed=2)]
    fit = soak_report.slope_after_warmup(samples, 45 * 60)
    assert fit["ci95_low"] < 0 < fit["ci95_high"] < 2  # the ramp is warm-up, not a trend


def test_autocorrelated_noise_widens_the_interval() -> None:
    rnd = random.Random(3)
    walk, level = [], 0.0
    for t in range(0, 45 * 60, 60):
        level = 0.9 * level + rnd.gauss(0, 0.5)
        walk.append((float(t), 60 + level))
    shuffled = [(t, m) for (t, _), (_, m) in zip(walk, random.Random(4).sample(walk, len(walk)), strict=True)]
    assert soak_report.fit(walk)[1] > soak_report.fit(shuffled)[1]


def test_component_slopes_name_the_part_that_grows() -> None:
    series = [(float(t), {"proc_heap_mb": 10 + 4 * t / 3600, "proc_file_mb": 20.0}) for t in range(0, 2700, 30)]
    slopes = soak_report.component_slopes(series, 2700)
    assert abs(slopes["proc_heap_mb"] - 4) < 0.01 and abs(slopes["proc_file_mb"]) < 0.01


def test_rss_net_of_the_block_cache_takes_away_only_the_caches_growth() -> None:
    # RSS = 60 MB + a cache filling at 6 MB/h (reported every 5 s, the RSS sampled every second) + 1 MB/h else.
    rss = [(float(t), 60 + 7 * t / 3600) for t in range(0, 2700)]
    series = [(float(t), {"rocksdb_block_cache_mb": 6 * t / 3600}) for t in range(0, 2700, 5)]
    net = soak_report.net_of_block_cache(rss, series)
    assert len(net) == len(rss)
    fitted = soak_report.slope_after_warmup(net, 2700)
    assert abs(fitted["slope_mb_per_hour"] - 1) < 0.05
    assert soak_report.net_of_block_cache(rss, []) == []


def test_the_verdict_names_every_view_and_judges_each_bound_by_itself() -> None:
    rss = _series(0.0, 45, 0.3, seed=5)
    growing = _series(8.0, 45, 0.3, seed=6)[::10]  # one sample every 50 s, as the injections give
    views = soak_report.other_views(rss, [], growing, 45 * 60)
    assert set(views) == set(soak_report.OTHER_VIEWS)
    text = soak_report.verdict(soak_report.slope_after_warmup(rss, 45 * 60), {},
                               {soak_report.OTHER_VIEWS[k]: v for k, v in views.items()})
    settled = next(line for line in text.splitlines() if line.startswith("- settled"))
    assert "NOT under" in settled and "(upper bound under the 2 MB/h goal)" in text
    assert "less RocksDB" not in text  # no block-cache figures: a view with no points is left out, not faked


def test_a_catching_up_load_makes_up_for_a_pause_within_its_burst_bound() -> None:
    from tests.reliability.load import MAX_BURST, Load, pinned

    load = Load(admin=None, topic="t", rate=4000, batches_per_s=10, catch_up=True)  # type: ignore[arg-type]
    assert load._size(began=0.0, now=0.05) == 400  # on pace: the usual batch
    load.sent = 4000
    assert load._size(began=0.0, now=3.0) == 400 * MAX_BURST  # 8,000 behind after a 2 s pause: bounded bursts
    load.sent = 11_000
    assert load._size(began=0.0, now=3.0) == 1000  # the rest of what is due
    plain = Load(admin=None, topic="t", rate=4000, batches_per_s=10)  # type: ignore[arg-type]
    assert plain._size(began=0.0, now=3.0) == 400  # without catch_up a pause is simply lost
    part = pinned(3)
    assert {part(b"k%d" % i) for i in range(50)} == {0, 1, 2} and part(None) == part(b"")


def test_the_slope_per_hour_of_default_load_divides_by_the_hours_the_run_stands_for() -> None:
    fit95 = {"slope_mb_per_hour": 4.0, "ci95_low": -2.0, "ci95_high": 8.0}
    reached = soak_report.reached_vs_default(45 * 60, faults=240, mean_gap=11.0, updates=21_600_000,
                                             publications=2 * 5_400, tables=2, failed_batches=0)
    d = soak_report.per_default_hour(fit95, reached)
    # Publications reached half of three hours, the least of the three: 45 minutes stand for 1.5 h of the default.
    assert (d["default_hours"], d["scale"]) == (1.5, 0.5)
    assert (d["slope_mb_per_hour"], d["ci95_low"], d["ci95_high"]) == (2.0, -1.0, 4.0)
    assert "NOT under" in soak_report.per_default_hour_md(d)
