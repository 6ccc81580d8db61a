"""The demo's Spark step (``globald demo``): a local session whose JVM runs in a process group of its own, and a batch
of orders enriched through ``globald.spark.GlobalTableView``, every city checked against the store."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ORDERS = 2_000
Say = Callable[[str], None]


def start_spark(log: Path) -> SparkSession:
    """A local[2] session whose JVM (spark-submit, and the Python workers it forks) runs in a process group of its
    own, writing to ``log``: a Ctrl-C cannot leave it behind, since clean-up stops every child group
    (``stop_groups``), even one whose start was cut short before PySpark knew its PID; nor can it print a stack
    trace over the terminal after the demo has removed the directory it was to write its port into."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    conf = (SparkConf().setMaster("local[2]").setAppName("globald-demo").set("spark.ui.enabled", "false")
            .set("spark.ui.showConsoleProgress", "false").set("spark.sql.shuffle.partitions", "4")
            .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.local.dir", str(log.parent / "spark-local")))
    with open(log, "ab") as out:
        gateway = launch_gateway(conf, popen_kwargs={"start_new_session": True, "stdout": out,
                                                     "stderr": subprocess.STDOUT})
    # SparkContext installs its own SIGINT handler (cancel the jobs, raise KeyboardInterrupt), which knows nothing
    # of the clean-up that must not be interrupted: the demo's handler is put back.
    handler = signal.getsignal(signal.SIGINT)
    try:
        SparkContext(conf=conf, gateway=gateway)
    finally:
        signal.signal(signal.SIGINT, handler)
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_enrichment(config_path: Path, table: str, customers: dict[bytes, bytes], say: Say,
                     log: Path) -> dict[str, Any] | None:
    """Enrich a batch of orders with PySpark through ``globald.spark.GlobalTableView``; None when skipped."""
    try:
        import pyspark.sql  # noqa: F401
        from pyspark.sql import functions as F

        from globald.spark import GlobalTableView
    except ImportError as e:
        say(f"Spark step skipped: {e} (install the [spark] extra; globald.spark ships with the snapshots feature)")
        return None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: nothing listens beyond loopback
    say("Spark: starting a local session (local[2])")
    spark = start_spark(log)
    interrupted = False
    try:
        rnd = random.Random(7)
        keys = sorted(customers)
        orders = [(f"order-{i:05d}", (rnd.choice(keys) if rnd.random() < 0.95 else b"customer-unknown").decode(),
                   round(rnd.uniform(5, 500), 2)) for i in range(ORDERS)]
        df = spark.createDataFrame(orders, ["order_id", "customer_id", "amount"])
        view = GlobalTableView(spark, str(config_path), table)
        descriptor = view.refresh()
        say(f"Spark: view refreshed to snapshot {descriptor.get('snapshot')} at offsets {descriptor.get('offsets')}")
        enriched = view.join(df, "customer_id", value_col="customer", timestamp_col="customer_ts")
        enriched = enriched.withColumn("city", F.get_json_object(F.col("customer").cast("string"), "$.city"))
        rows = enriched.select("order_id", "customer_id", "city").collect()
        by_city = {r["city"] or "(unknown customer)": r["n"] for r in
                   enriched.groupBy("city").agg(F.count("*").alias("n")).collect()}
    except KeyboardInterrupt:
        interrupted = True  # a py4j call cut mid-way leaves its connection unusable: clean-up stops the JVM's group
        raise
    finally:
        if not interrupted:
            spark.stop()
    wrong = sum(1 for r in rows if r["city"] != _city(customers.get(r["customer_id"].encode())))
    if wrong:
        raise AssertionError(f"Spark: {wrong} orders were enriched with a value the store does not hold")
    matched = sum(1 for r in rows if r["city"] is not None)
    say(f"Spark: enriched {len(rows):,} orders, {matched:,} matched a customer, every city checked against the "
        "store ✓")
    say("Spark: orders per city: " + ", ".join(f"{c} {n}" for c, n in sorted(by_city.items())))
    return {"orders": len(rows), "matched": matched, "snapshot": descriptor.get("snapshot")}


def _city(value: bytes | None) -> str | None:
    return None if value is None else json.loads(value).get("city")
