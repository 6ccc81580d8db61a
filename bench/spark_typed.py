"""Typed join in Spark per core (issue 24): ``python -m bench.spark_typed [ARGS]`` is
``python -m globald.spark.bench --benches typed [ARGS]``, where the measurement lives (``globald.spark.bench_typed``).

    python -m bench.spark_typed                                          # 100k keys, 300k lookups, best of 3
    python -m bench.spark_typed --spark-keys 20000 --lookups 60000 --typed-rounds 1
"""

from __future__ import annotations

import sys

from globald.spark.bench import main

if __name__ == "__main__":
    sys.exit(main(["--benches", "typed", *sys.argv[1:]]))
