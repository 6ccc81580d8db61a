"""Typed join in Spark per core (issue 24): ``python -m bench.spark_typed [ARGS]`` is
``python -m bench.spark --benches typed [ARGS]``, where the measurement lives (``bench.spark_typed_join``).

    python -m bench.spark_typed                                          # 100k keys, 300k lookups, best of 3
    python -m bench.spark_typed --spark-keys 20000 --lookups 60000 --typed-rounds 1
"""

from __future__ import annotations

import sys

from bench.spark import main

if __name__ == "__main__":
    sys.exit(main(["--benches", "typed", *sys.argv[1:]]))
