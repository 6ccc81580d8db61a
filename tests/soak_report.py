"""The soak's figures: RSS over time beside what it is made of, its slope after warm-up with a 95 % interval, and
the Python allocation sites that grew (``tests.soak`` samples; this module only computes and formats).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from tests.harness import STOPPED_STATES, process_state

# What the daemon's status reports of RocksDB's memory (globald.ops.memory), summed over the tables, in MB.
ROCKSDB_KINDS = ("block_cache_mb", "memtables_mb", "table_readers_mb")
# malloc's heap (globald.ops.allocator.heap_bytes): handed out, and kept resident without being handed out.
MALLOC_KINDS = ("in_use_mb", "free_mb")
# Where RSS lives by mapping (globald.ops.memory.process_memory), in MB, and the thread count.
PROC_KINDS = ("heap_mb", "anon_mb", "pymalloc_mb", "stacks_mb", "file_mb", "threads")
# Python's allocator and librdkafka's buffers, from the daemon's status (python_ / kafka_ prefixed).
OTHER_KINDS = ("python_allocated_blocks", "python_traced_mb", "python_tracemalloc_self_mb", "kafka_fetchq_mb")
# The fraction of a run before the slope is fitted: fixed in advance, not chosen by looking at the curve. It covers
# the initial restore's buffers, the block cache's first fill and the first trims; a third of 45 minutes is 15.
WARMUP_FRACTION = 1 / 3

Samples = list[tuple[float, float]]
Series = list[tuple[float, dict[str, float]]]


def rss_mb(pid: int, running: bool = False) -> float | None:
    """``pid``'s resident set in MB; None once it is gone, and with ``running`` while it is stopped (SIGSTOP). The
    retention fault freezes the daemon for the 15-25 s the broker's tool takes: its memory stands still meanwhile,
    and sampling it every second would weigh that one moment twenty times in the minute's median."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (OSError, ValueError):
        return None
    if running and process_state(pid) in STOPPED_STATES:
        return None
    rss = fields.get("VmRSS")
    return int(rss.split()[0]) / 1024 if rss else None


def slope_mb_per_hour(samples: Samples) -> float:
    return fit(samples)[0]


def fit(samples: Samples) -> tuple[float, float, int]:
    """Least-squares slope (MB/hour), its standard error (MB/hour), and the number of points.

    The standard error is widened for lag-1 autocorrelation of the residuals (AR(1): the effective number of
    points is n (1 - r) / (1 + r)): RSS samples a minute apart are not independent, and the plain formula would
    give an interval too narrow to trust."""
    n = len(samples)
    if n < 3:
        return 0.0, math.inf, n
    ts, ms = [t for t, _ in samples], [m for _, m in samples]
    mt, mm = statistics.fmean(ts), statistics.fmean(ms)
    sxx = sum((t - mt) ** 2 for t in ts)
    if sxx == 0:
        return 0.0, math.inf, n
    b = sum((t - mt) * (m - mm) for t, m in samples) / sxx
    res = [m - (mm + b * (t - mt)) for t, m in samples]
    se = math.sqrt(sum(r * r for r in res) / (n - 2) / sxx)
    den = sum(r * r for r in res)
    r1 = sum(res[i] * res[i - 1] for i in range(1, n)) / den if den else 0.0
    if r1 > 0:
        se *= math.sqrt((1 + r1) / (1 - min(r1, 0.95)))
    return b * 3600, se * 3600, n


def t975(df: int) -> float:
    """Student's t 97.5 % quantile (Cornish-Fisher expansion; within 0.01 of the table from 5 degrees up)."""
    z = 1.959964
    if df <= 0:
        return math.inf
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


def per_minute(samples: Samples, reduce: Callable[[list[float]], float] = statistics.median,
               minutes: int = 1) -> Samples:
    """One value per window of ``minutes`` (the median by default): faults make sampling uneven, and a fit on raw
    samples would weigh the minutes spent recovering (sampled more often) over the quiet ones."""
    bins: dict[int, list[float]] = {}
    for t, m in samples:
        bins.setdefault(int(t // (60 * minutes)), []).append(m)
    return [((k + 0.5) * 60 * minutes, reduce(v)) for k, v in sorted(bins.items())]


def slope_after_warmup(rss: Samples, duration: float, reduce: Callable[[list[float]], float] = statistics.median,
                       minutes: int = 1) -> dict[str, float]:
    """RSS slope after the first WARMUP_FRACTION of the run, from per-window medians (or ``reduce``: ``min`` fits
    the floor RSS returns to between faults, which only memory kept raises), with its 95 % interval."""
    warm = duration * WARMUP_FRACTION
    points = per_minute([s for s in rss if s[0] >= warm], reduce, minutes)
    b, se, n = fit(points)
    half = t975(n - 2) * se
    return {"warmup_min": round(warm / 60, 1), "minutes_fitted": n, "slope_mb_per_hour": round(b, 2),
            "se_mb_per_hour": round(se, 2), "ci95_low": round(b - half, 2), "ci95_high": round(b + half, 2)}


def net_of_block_cache(rss: Samples, series: Series) -> Samples:
    """RSS less RocksDB's block cache as last reported at or before each sample (the first report before it). The
    cache fills towards its configured size (``[store] block_cache_mb`` per table) for hours, index and filter blocks
    of every new table file entering it: growth with a bound set by configuration, which a 45-minute fit would
    otherwise count as a trend. What this leaves growing has no such bound."""
    cache = [(t, m["rocksdb_block_cache_mb"]) for t, m in series if "rocksdb_block_cache_mb" in m]
    if not cache:
        return []
    out, i = [], 0
    for t, mb in rss:
        while i + 1 < len(cache) and cache[i + 1][0] <= t:
            i += 1
        out.append((t, mb - cache[i][1]))
    return out


def component_slopes(series: Series, duration: float) -> dict[str, float]:
    """Each component's slope after warm-up (MB/hour; threads and blocks per hour), from per-minute medians: which
    of them carries RSS's slope."""
    warm = duration * WARMUP_FRACTION
    kinds = sorted({k for _, m in series for k in m})
    out = {}
    for kind in kinds:
        points = per_minute([(t, m[kind]) for t, m in series if t >= warm and kind in m])
        if len(points) >= 3:
            out[kind] = round(fit(points)[0], 2)
    return out


def quarters(rss: Samples, series: Series, duration: float) -> list[dict[str, float]]:
    """RSS median and maximum, and the median of each component, in each quarter of the run's time (faults make
    sampling uneven, so quarters of the samples would not be quarters of the run)."""
    out = []
    for q in range(4):
        lo, hi = duration * q / 4, duration * (q + 1) / 4
        mem = [mb for t, mb in rss if lo <= t < hi]
        row: dict[str, float] = {
            "quarter": q + 1, "from_min": round(lo / 60, 1), "to_min": round(hi / 60, 1), "samples": len(mem),
            "rss_median_mb": round(statistics.median(mem), 1) if mem else math.nan,
            "rss_max_mb": round(max(mem), 1) if mem else math.nan}
        db = [m for t, m in series if lo <= t < hi]
        for kind in sorted({k for m in db for k in m}):
            values = [m[kind] for m in db if kind in m]
            row[kind] = round(statistics.median(values), 2) if values else math.nan
        out.append(row)
    return out


def _cell(q: dict[str, float], key: str) -> str:
    v = q.get(key, math.nan)
    return "-" if isinstance(v, float) and math.isnan(v) else f"{v:g}"


def memory_table(qs: list[dict[str, float]], slope: float, slope_last_half: float) -> str:
    cols = [("RSS median", "rss_median_mb"), ("RSS max", "rss_max_mb"),
            *((f"rocksdb {k[:-3].replace('_', ' ')}", f"rocksdb_{k}") for k in ROCKSDB_KINDS),
            *((f"malloc {k[:-3].replace('_', ' ')}", f"malloc_{k}") for k in MALLOC_KINDS)]
    proc = [("smaps RSS", "proc_rss_mb"), ("[heap]", "proc_heap_mb"), ("other anon", "proc_anon_mb"),
            ("1 MiB anon (pymalloc)", "proc_pymalloc_mb"), ("thread stacks", "proc_stacks_mb"),
            ("threads", "proc_threads"), ("file-backed", "proc_file_mb"),
            ("Python blocks", "python_allocated_blocks"), ("traced", "python_traced_mb"),
            ("tracemalloc self", "python_tracemalloc_self_mb"), ("librdkafka fetch queues", "kafka_fetchq_mb")]
    lines = ["## Daemon memory by quarter (MB, medians; RocksDB summed over the tables; malloc: the allocator's heap)",
             ""]
    for title, table in (("", cols), ("### What RSS is made of (smaps), Python's allocator, librdkafka", proc)):
        if title:
            lines += [title, ""]
        lines += ["| quarter | minutes | " + " | ".join(c for c, _ in table) + " |",
                  "|---|---|" + "---|" * len(table)]
        lines += [f"| {q['quarter']} | {q['from_min']}-{q['to_min']} | " + " | ".join(_cell(q, k) for _, k in table)
                  + " |" for q in qs]
        lines.append("")
    lines += [f"RSS trend: {slope:+.1f} MB/hour over the whole run, {slope_last_half:+.1f} MB/hour over the last "
              "half.", ""]
    return "\n".join(lines) + "\n"


def verdict(fit95: dict[str, float], components: dict[str, float], others: dict[str, dict[str, float]]) -> str:
    """The goal's fit (per-minute medians of RSS after warm-up) and, under it, ``others``: the same slope fitted on
    other views of RSS, each named by what it shows."""
    growing = sorted(((v, k) for k, v in components.items() if not k.endswith(("threads", "blocks"))
                      and k != "proc_rss_mb"), reverse=True)[:6]
    parts = ", ".join(f"{k} {v:+.2f}" for v, k in growing)

    def bound(f: dict[str, float]) -> str:
        return f"upper bound {'under' if f['ci95_high'] < 2 else 'NOT under'} the 2 MB/h goal"

    lines = "".join(f"- {name}: {f['slope_mb_per_hour']:+.2f} MB/h, 95 % [{f['ci95_low']:+.2f}, "
                    f"{f['ci95_high']:+.2f}] ({f['minutes_fitted']} points; {bound(f)})\n"
                    for name, f in others.items() if f["minutes_fitted"] >= 3)
    return (f"\n## RSS slope after warm-up\n\nWarm-up: the first {fit95['warmup_min']} min (a third of the run, fixed "
            f"in advance). Fit: least squares on {fit95['minutes_fitted']} per-minute medians, standard error widened "
            f"for lag-1 autocorrelation, Student's t.\n\n**{fit95['slope_mb_per_hour']:+.2f} MB/h, 95 % interval "
            f"[{fit95['ci95_low']:+.2f}, {fit95['ci95_high']:+.2f}] MB/h** ({bound(fit95)}).\n\n"
            f"The same fit on other views of RSS:\n{lines}\n"
            f"Components after warm-up, MB/h (largest first): {parts}.\n")


OTHER_VIEWS = {
    "floor": "floor (the minimum of each 3 minutes: what RSS returns to between faults)",
    "settled": "settled (RSS just before each injection, the daemon recovered and at the log end; medians per minute)",
    "net_of_block_cache": "less RocksDB's block cache (which fills towards its configured size)",
}


def other_views(rss: Samples, series: Series, settled: Samples, duration: float) -> dict[str, dict[str, float]]:
    """The slope after warm-up of each view in OTHER_VIEWS, by its key."""
    return {"floor": slope_after_warmup(rss, duration, min, 3),
            "settled": slope_after_warmup(settled, duration),
            "net_of_block_cache": slope_after_warmup(net_of_block_cache(rss, series), duration)}


def rocksdb_bound(config: Path, tables: int) -> str:
    """What the [store] settings allow RocksDB per table (see globald.store.options): the block cache, and the
    memtables of the values family plus those of the two small families."""
    from globald.settings.config import load
    from globald.store.options import _SMALL_FAMILY_BUFFER_MB

    s = load(config).store
    memtables = (s.write_buffer_mb + 2 * _SMALL_FAMILY_BUFFER_MB) * s.max_write_buffers
    per_table = s.block_cache_mb + memtables
    return (f"RocksDB bound per table from [store]: block cache {s.block_cache_mb} MB + memtables "
            f"({s.write_buffer_mb} + 2 x {_SMALL_FAMILY_BUFFER_MB}) MB x {s.max_write_buffers} = {per_table} MB; "
            f"{tables} tables: {per_table * tables} MB (the block cache alone: {s.block_cache_mb * tables} MB).\n")


def tracemalloc_growth(directory: Path, warmup_fraction: float = WARMUP_FRACTION, top: int = 25) -> str:
    """The lines whose Python allocations grew most from the first dump after warm-up to the last, grouped by the
    innermost frame and by whole traceback, and the traced total at every dump."""
    import tracemalloc

    dumps = sorted(directory.glob("tracemalloc-*.bin"))
    if len(dumps) < 3:
        return f"\nFewer than 3 tracemalloc dumps in {directory}: no comparison.\n"
    keep = [tracemalloc.Filter(False, tracemalloc.__file__)]
    snaps = [tracemalloc.Snapshot.load(str(d)).filter_traces(keep) for d in dumps]
    totals = [sum(s.size for s in snap.statistics("filename")) / 2**20 for snap in snaps]
    i = min(len(dumps) - 2, max(1, math.ceil((len(dumps) - 1) * warmup_fraction)))
    early, late = snaps[i], snaps[-1]
    lines = [f"## Python allocations (tracemalloc), {dumps[i].name} -> {dumps[-1].name}: "
             f"{totals[-1] - totals[i]:+.2f} MB", "",
             "Traced MB at each dump: " + ", ".join(f"{t:.2f}" for t in totals), "", "```"]
    lines += [str(d) for d in late.compare_to(early, "lineno")[:top]]
    lines += ["```", "", "Largest growth by traceback:", "", "```"]
    for d in late.compare_to(early, "traceback")[:5]:
        lines.append(f"{d.size_diff / 1024:+.1f} KiB, {d.count_diff:+d} blocks")
        lines += [f"    {line}" for line in d.traceback.format(limit=8)]
    return "\n".join(["", *lines, "```", ""])


# The default load (tests.soak's defaults) and the three hours the accelerated form stands for.
DEFAULT_RATE, DEFAULT_FAULT_EVERY_S, DEFAULT_PUBLISH_S, DEFAULT_HOURS = 2000, 45.0, 1.0, 3.0


def reached_vs_default(elapsed: float, faults: int, mean_gap: float, updates: int, publications: int, tables: int,
                       failed_batches: int) -> dict[str, float]:
    """What a run reached beside three hours at the default load: 2000 records/s offered (21.6 M), a publication a
    second per table (10,800 each), a fault every 45 s from injection to injection (240). The default soak pauses
    its load while each fault lasts and recovers, so its own three hours deliver fewer updates than offered."""
    seconds = DEFAULT_HOURS * 3600
    return {"minutes": round(elapsed / 60, 1), "faults": faults,
            "faults_per_hour": round(faults / elapsed * 3600, 1) if elapsed else 0.0,
            "mean_gap_s": round(mean_gap, 1), "updates": updates, "failed_batches": failed_batches,
            "publications_per_table": round(publications / tables),
            "target_faults": round(seconds / DEFAULT_FAULT_EVERY_S),
            "target_updates": round(DEFAULT_RATE * seconds),
            "target_publications_per_table": round(seconds / DEFAULT_PUBLISH_S)}


def per_default_hour(fit95: dict[str, float], r: dict[str, float]) -> dict[str, float]:
    """The fit per hour of the default load rather than per hour of the run. The run stands for as many hours of the
    default load as the least it reached of faults, updates and publications (each beside three hours): a run that
    did three hours' work in 45 minutes divides its slope by four. That holds for memory that grows with the work
    done (every growth found so far did: per publication, per catch-up); memory that grew with the clock alone
    would grow as fast per hour in both, and only the run's own figure bounds it."""
    share = min(r["faults"] / r["target_faults"], r["updates"] / r["target_updates"],
                r["publications_per_table"] / r["target_publications_per_table"])
    hours = DEFAULT_HOURS * share
    scale = (r["minutes"] / 60) / hours if hours > 0 else math.inf
    return {"default_hours": round(hours, 2), "scale": round(scale, 3),
            **{k: round(fit95[k] * scale, 2) for k in ("slope_mb_per_hour", "ci95_low", "ci95_high")}}


def per_default_hour_md(d: dict[str, float]) -> str:
    under = "under" if d["ci95_high"] < 2 else "NOT under"
    return (f"Per hour of the default load (the run stands for {d['default_hours']} h of it, the least reached of "
            f"faults, updates and publications): **{d['slope_mb_per_hour']:+.2f} MB/h, 95 % [{d['ci95_low']:+.2f}, "
            f"{d['ci95_high']:+.2f}]** (upper bound {under} the 2 MB/h goal). This holds for memory that grows with "
            "the work done; memory that grew with the clock alone is bounded only by the run's own figure above.\n")


def reached_md(r: dict[str, float]) -> str:
    def pct(a: str, b: str) -> str:
        return f"{r[a]:,} of {r[b]:,} ({100 * r[a] / r[b]:.0f} %)"

    return (f"## Reached in {r['minutes']} min, beside {DEFAULT_HOURS:g} h at the default load\n\n"
            f"- faults: {pct('faults', 'target_faults')}; {r['faults_per_hour']} an hour, one every "
            f"{r['mean_gap_s']} s on average from injection to injection\n"
            f"- record updates produced: {pct('updates', 'target_updates')} ({r['failed_batches']} batches refused "
            "by a broker down)\n"
            f"- snapshot publications per table: {pct('publications_per_table', 'target_publications_per_table')}\n\n")


def main(argv: list[str]) -> int:
    """``python -m tests.soak_report SUMMARY.json``: the slope figures again from a finished run's samples, by
    minute medians and by the views of OTHER_VIEWS."""
    doc = json.loads(Path(argv[0]).read_text())
    rss = [(float(t), float(m)) for t, m in doc["memory"]]
    duration = rss[-1][0] if rss else 0.0
    series = [(float(t), m) for t, m in doc.get("components_mb", [])]
    settled = [(float(t), float(m)) for t, m in doc.get("settled", [])]
    after = slope_after_warmup(rss, duration)
    out = {"median_per_minute": after,
           **({"per_default_hour": per_default_hour(after, doc["reached"])} if "reached" in doc else {}),
           **other_views(rss, series, settled, duration),
           "components_mb_per_hour": component_slopes(series, duration)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
