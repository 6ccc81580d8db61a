"""Test support, not shipped in the wheel: what starts real parts (a Spark Connect server, a Spark standalone
cluster, a Tansu broker), and what only tests and benchmarks do to the product's embedded Kafka 0.9 (``broker``:
signal or stop the broker alone; ``admin``: other brokers' admins, added partitions, an advanced log start;
``oracle``: the fold with each value's timestamp and location).
"""
