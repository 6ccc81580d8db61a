"""globald benchmarks: restore throughput against the raw pipeline and the per-record design, and the rest.

Every comparison runs in one process run, on one topic of one embedded broker, interleaved and repeated, and is
reported as a ratio of medians, because the machines these run on are small and shared. Run ``python -m bench``.
"""
