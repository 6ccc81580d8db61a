"""Memory of a real Spark executor's Python workers, before and after the columnar file (issues 24 and 34).

    python -m bench.spark --benches executor-memory --keys 1000000 --before-tree /path/to/a/checkout/of/main
    python -m bench.spark --benches executor-memory --memory-phases imports,before,raw_first_maps,raw_mapped ...

A classic ``local[4]`` session is the executor: ``spark.python.worker.reuse`` on, and the probe DataFrame in 4
partitions, so 4 Python workers (forked by the pyspark daemon) run the 4 tasks at once. The table is N Avro
records of 10 fields (``bench.spark_typed_join``), mirrored by two real daemons: raw, and typed. Phases, each
in a fresh session (so fresh workers), each looking every key of the table up once:
- ``imports``: a ``mapInArrow`` that imports globald's Spark side and passes the batches through: what every
  worker holds anyway (interpreter, pyarrow, pandas, numpy, pyspark, globald);
- ``before``: the raw ``view.join`` with ``memory_index_mb`` large enough for the table, its workers importing
  globald from ``--before-tree`` (a checkout from before issue 34: ``spark.executorEnv.PYTHONPATH``), so each
  worker reads the snapshot into its own in-memory index (``globald.spark.memindex``): what every worker did before
  issues 24 and 34 (a typed table's user then decodes each value per query, which holds nothing). Without
  ``--before-tree`` the phase is left out: this tree's raw join maps the file;
- ``raw_first_maps``: the raw ``view.join`` of this tree with the same ``memory_index_mb``, no file yet: the first
  worker writes the raw snapshot's file (``globald.spark.mapped``) while the others wait on its lock, then all map it;
- ``raw_mapped``: the same in fresh workers, the file already there: every worker only maps it;
- ``after_first_decodes``: the typed ``view.join`` at once; when the snapshot has no columnar file yet (the
  daemon's own decode process, ``globald.ops.decoding``, has not written it: ``columnar_file_before_query``), the
  first worker decodes it into one while the others wait on its lock, then all map it;
- ``after_mapped``: the same in fresh workers, the file already there: every worker only maps it.
Each worker's ``Rss`` and ``Pss`` come from ``/proc/<pid>/smaps_rollup`` right after the query, while the idle
workers still hold their handles (Spark keeps reused workers for a minute), and at their highest sum during it
(sampled every 0.2 s). PSS divides a shared page among the processes mapping it, so its sum is what the workers
cost the host; RSS counts the file's pages in each. The workers are the children of the pyspark daemon among this
process's descendants (other jobs' Spark workers on the host are not counted); the JVM is not counted.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from bench.spark_harness import TABLE, log, spark_session, wait
from bench.spark_typed_join import Format, mirror, produce
from tests.support.admin import TopicAdmin

MB = 2**20
PHASES = ("imports", "before", "raw_first_maps", "raw_mapped", "after_first_decodes", "after_mapped")
RAW_PHASES = ("before", "raw_first_maps", "raw_mapped")
TYPED_PHASES = ("after_first_decodes", "after_mapped")
KEY_FORMAT = "cust-%011d"  # spark_typed_join.key_of, as Spark's format_string
INDEX_MB = 8192  # the raw view's memory_index_mb: the whole table fits, so every worker indexes it in memory


def smaps_rollup(pid: int) -> dict[str, int]:
    """``Rss`` and ``Pss`` of a process in bytes (Linux); empty once it is gone."""
    found: dict[str, int] = {}
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return found
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("Rss", "Pss"):
            found[name.lower()] = int(rest.split()[0]) * 1024
    return found


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process, from /proc/<pid>/stat (after the command's closing parenthesis)."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            out[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return out


def pyspark_workers(root: int | None = None) -> tuple[list[int], list[int]]:
    """(daemons, workers) among the descendants of ``root`` (this process): pyspark daemon processes, and the
    workers they forked (which keep the daemon's command line)."""
    parents = _parents()
    mine = {root or os.getpid()}
    grew = True
    while grew:
        more = {p for p, pp in parents.items() if pp in mine and p not in mine}
        mine |= more
        grew = bool(more)
    pyspark = set()
    for pid in mine:
        try:
            if b"pyspark.daemon" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pyspark.add(pid)
        except OSError:
            continue
    daemons = sorted(p for p in pyspark if parents.get(p) not in pyspark)
    return daemons, sorted(pyspark - set(daemons))


def workers_memory() -> dict[str, Any]:
    daemons, workers = pyspark_workers()
    mem = [smaps_rollup(p) for p in workers]
    mem = [m for m in mem if m]
    return {"workers": len(mem), "rss_mb_sum": round(sum(m["rss"] for m in mem) / MB, 1),
            "pss_mb_sum": round(sum(m["pss"] for m in mem) / MB, 1),
            "rss_mb_each": [round(m["rss"] / MB) for m in mem], "pss_mb_each": [round(m["pss"] / MB) for m in mem],
            "daemon_pss_mb": round(sum(smaps_rollup(p).get("pss", 0) for p in daemons) / MB, 1)}


class Sampler:
    """The workers' memory every ``interval`` s in a thread; ``peak`` keeps the sample of the highest PSS sum."""

    def __init__(self, interval: float = 0.2) -> None:
        self.peak: dict[str, Any] = {"pss_mb_sum": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            got = workers_memory()
            if got["pss_mb_sum"] > self.peak["pss_mb_sum"]:
                self.peak = got

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def passthrough(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``imports`` phase: what a worker of a globald join imports (and the Avro decoder's), nothing looked up."""
    import globald.spark.executor
    import globald.spark.typed
    import globald.typed.avro  # noqa: F401

    for b in batches:
        yield pa.RecordBatch.from_arrays([b.column(0), pa.nulls(b.num_rows, pa.int64())], ["k", "n"])


def phase(name: str, raw: Path, typed: Path | None, keys: int, states: dict[str, Path | None],
          before_tree: str | None = None) -> dict[str, Any]:
    """One phase in a fresh local[4] session: the query, then the workers' memory while they hold their handles."""
    from pyspark.sql import functions as F

    from globald.spark import GlobalTableView

    conf = {"spark.python.worker.reuse": "true"}
    if name == "before" and before_tree is not None:  # the workers import that tree's globald, ahead of this one
        conf["spark.executorEnv.PYTHONPATH"] = before_tree
    spark = spark_session("local[4]", conf)
    try:
        # Every key once, made in the JVM: a DataFrame from a Python list would start Python workers of its own.
        df = spark.range(keys).select(F.format_string(KEY_FORMAT, "id").alias("k")).repartition(4).cache()
        df.count()
        query: Callable[[], Any]
        view = None
        if name == "imports":
            query = df.mapInArrow(passthrough, "k string, n long").agg(F.count("k")).collect
        elif name in RAW_PHASES:
            view = GlobalTableView(spark, raw, TABLE, memory_index_mb=INDEX_MB)
            view.refresh()
            query = view.join(df, "k").agg(F.sum(F.length("value")), F.count("value")).collect
        else:
            assert typed is not None
            view = GlobalTableView(spark, typed, TABLE)
            view.refresh()
            query = view.join(df, "k").agg(F.sum(F.col("value.visits")), F.count("value")).collect
        # The daemon decodes typed snapshots too (globald.ops.decoding, at nice 19): whether a worker had to.
        state = states["raw" if name in RAW_PHASES else "typed"]
        file_before = state is not None and any(state.rglob("columnar-*.arrow"))
        log(f"executor memory: {name}")
        started = time.perf_counter()
        with Sampler() as sampler:
            rows = query()
        took = time.perf_counter() - started
        held = workers_memory()
        # The snapshot read: "after_mapped" maps the file "after_first_decodes" wrote only if it is the same one.
        held["columnar_file_before_query"] = file_before
        held["snapshot"] = None if view is None else (view.descriptor or {}).get("snapshot")
        if view is not None:
            view.close()
        found = int(rows[0][-1])
        peak = {k: sampler.peak.get(k) for k in ("rss_mb_sum", "pss_mb_sum")}
        return {**held, "query_s": round(took, 2), "found": found, "peak_during_query": peak}
    finally:
        spark.stop()
        wait(lambda: not any(pyspark_workers()), 60, "the pyspark daemon and workers to exit")


def measure_executor_memory(admin: TopicAdmin, kafka: dict[str, str], work: Path, keys: int,
                            procs: list[Any], phases: tuple[str, ...] = PHASES,
                            before_tree: str | None = None) -> dict[str, Any]:
    """The ``phases`` over a table of ``keys`` Avro records; the daemons started join ``procs``. The typed table
    is mirrored only for its phases; ``before`` runs only with ``before_tree``."""
    phases = tuple(p for p in phases if p != "before" or before_tree is not None)
    fdir = work / "memory-avro"
    fdir.mkdir()
    fmt = Format("avro", fdir, keys)
    topic = "bench-memory-avro"
    produce(admin, topic, fmt)
    raw, raw_state = mirror(admin, kafka, work, topic, None, procs)
    typed, typed_state = (mirror(admin, kafka, work, topic, fmt.section, procs) if set(TYPED_PHASES) & set(phases)
                          else (None, None))
    value_bytes = sum(len(v) for _, v, _ in fmt.items)
    assert fmt.items[-1][0] == (KEY_FORMAT % (keys - 1)).encode()
    del fmt
    out: dict[str, Any] = {"keys": keys, "executor": "local[4]", "python_workers": 4, "format": "avro",
                           "raw_value_bytes_per_key": round(value_bytes / keys, 1), "key_bytes": 16,
                           "memory_index_mb": INDEX_MB, "before_tree": before_tree}
    states: dict[str, Path | None] = {"raw": raw_state, "typed": typed_state}
    for name in phases:
        out[name] = phase(name, raw, typed, keys, states, before_tree)
        assert out[name]["workers"] == 4, f"{name}: {out[name]['workers']} Python workers, not 4"
        assert name == "imports" or out[name]["found"] == keys, out[name]
        log(f"executor memory: {name}: RSS {out[name]['rss_mb_sum']} MB, PSS {out[name]['pss_mb_sum']} MB")
    for kind, state in states.items():
        if state is not None:
            files = list(state.rglob("columnar-*.arrow"))
            out[f"{kind}_file_mb"] = round(sum(f.stat().st_size for f in files) / MB, 1)
    base = out.get("imports")
    for name in phases:
        if base is not None and name != "imports":
            out[name]["pss_mb_above_imports"] = round(out[name]["pss_mb_sum"] - base["pss_mb_sum"], 1)
            out[name]["rss_mb_above_imports"] = round(out[name]["rss_mb_sum"] - base["rss_mb_sum"], 1)
    for after in ("after_mapped", "raw_mapped"):
        if base is not None and "before" in out and after in out:
            out[f"before_vs_{after}_pss_above_imports"] = round(
                out["before"]["pss_mb_above_imports"] / max(out[after]["pss_mb_above_imports"], 0.1), 2)
            out[f"before_vs_{after}_pss_held"] = round(out["before"]["pss_mb_sum"] / out[after]["pss_mb_sum"], 2)
    return out


# -- a versioned table: the latest-value join against the as-of join (issue 45) -----------------------------------

AS_OF_PHASES = ("imports", "as_of_latest", "as_of", "as_of_recent")


def _as_of_phase(name: str, files: dict[str, Path], keys: int, versions: int) -> dict[str, Any]:
    """One phase of ``measure_as_of_memory`` in a fresh local[4] session: every key once (at a time drawn over its
    versions' span, as ``bench.as_of_join.stream`` draws them: a replay; ``as_of_recent``: at a time after its
    newest version, as a stream of current events asks), then the workers' memory while they hold their
    mappings."""
    from pyspark.sql import functions as F

    from bench.as_of_join import (
        AS_OF_SCHEMA,
        BASE_TS,
        LATEST_SCHEMA,
        STEP_MS,
        as_of_join_fn,
        latest_join_fn,
        passthrough_as_of,
    )

    spark = spark_session("local[4]", {"spark.python.worker.reuse": "true"})
    try:
        span = (versions + 1) * STEP_MS
        at = (F.lit(BASE_TS - STEP_MS) + (F.hash(F.col("id") + 1) % span + span) % span if name != "as_of_recent"
              else F.lit(BASE_TS + versions * STEP_MS))  # after every key's newest version: "now"
        df = (spark.range(keys).select("id", F.format_string("key-%08d", "id").cast("binary").alias("k"),
                                       at.alias("ms"))
              .repartition(4).cache())
        df.count()
        if name == "imports":
            joined = df.select("k").mapInArrow(passthrough_as_of, "k binary, value long")
        elif name == "as_of_latest":
            joined = df.mapInArrow(latest_join_fn(str(files["latest"])), LATEST_SCHEMA)
        else:
            joined = df.mapInArrow(as_of_join_fn(str(files["as_of"])), AS_OF_SCHEMA)  # as_of, as_of_recent
        log(f"executor memory: {name}")
        started = time.perf_counter()
        with Sampler() as sampler:
            rows = joined.agg(F.count("k"), F.count("value")).collect()
        took = time.perf_counter() - started
        held = workers_memory()
        peak = {k: sampler.peak.get(k) for k in ("rss_mb_sum", "pss_mb_sum")}
        return {**held, "query_s": round(took, 2), "rows": int(rows[0][0]), "found": int(rows[0][1]),
                "peak_during_query": peak}
    finally:
        spark.stop()
        wait(lambda: not any(pyspark_workers()), 60, "the pyspark daemon and workers to exit")


def measure_as_of_memory(work: Path, keys: int, versions: int, value_bytes: int = 16,
                         phases: tuple[str, ...] = AS_OF_PHASES) -> dict[str, Any]:
    """Executor memory of a versioned table of ``keys`` x ``versions`` distinct values of ``value_bytes``: the
    latest-value join (``as_of_latest``: the latest-value file of the same table, each key's newest version) against
    the as-of join (``as_of``, ``as_of_recent``: the as-of file), each in fresh workers with the file already there,
    above what the workers import (``imports``). The files are written by the bench as a snapshot's are
    (``bench.as_of_join``'s ``latest_file`` and ``as_of_file``: no broker, no daemon), and the joins are
    ``view.join``'s mapInArrow bodies."""
    from bench.as_of_join import as_of_file, latest_file

    files = {"latest": work / "latest.arrow", "as_of": work / "asof.arrow"}
    log(f"writing the latest-value and as-of files of {keys} keys x {versions} versions")
    build = {"latest_file_s": round(latest_file(files["latest"], keys, versions, value_bytes), 1),
             "as_of_file_s": round(as_of_file(files["as_of"], keys, versions, value_bytes), 1)}
    out: dict[str, Any] = {"keys": keys, "versions": versions, "value_bytes": value_bytes, "distinct_values": True,
                           "key_bytes": 12, "executor": "local[4]", "python_workers": 4, **build,
                           "latest_file_mb": round(files["latest"].stat().st_size / MB, 1),
                           "as_of_file_mb": round(files["as_of"].stat().st_size / MB, 1)}
    out["file_ratio"] = round(out["as_of_file_mb"] / out["latest_file_mb"], 2)
    for name in phases:
        out[name] = _as_of_phase(name, files, keys, versions)
        assert out[name]["workers"] == 4, f"{name}: {out[name]['workers']} Python workers, not 4"
        assert out[name]["rows"] == keys, out[name]
        log(f"executor memory: {name}: RSS {out[name]['rss_mb_sum']} MB, PSS {out[name]['pss_mb_sum']} MB")
    assert out.get("as_of_latest", {}).get("found", keys) == keys
    base = out.get("imports")
    for name in phases:
        if base is not None and name != "imports":
            for m in ("pss", "rss"):
                out[name][f"{m}_mb_above_imports"] = round(out[name][f"{m}_mb_sum"] - base[f"{m}_mb_sum"], 1)
    for name in ("as_of", "as_of_recent"):
        if base is not None and {name, "as_of_latest"} <= set(phases):
            for m in ("pss", "rss"):
                out[f"{name}_vs_latest_{m}_above_imports"] = round(
                    out[name][f"{m}_mb_above_imports"] / max(out["as_of_latest"][f"{m}_mb_above_imports"], 0.1), 2)
    return out
