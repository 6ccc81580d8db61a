"""Ending a classic PySpark session together with its JVM.

``SparkSession.stop()`` stops the SparkContext but leaves PySpark's gateway JVM running (``SparkContext._gateway``,
reused by the next ``getOrCreate`` of the process) until the Python process exits: in ``make test`` that is a JVM of
~650 MB per xdist worker, idle from the end of the worker's first Spark module to the end of its session (measured
on CI's run, issue 40). ``stop_with_jvm`` ends it too, so that a module's session takes its JVM with it; the next
module's ``getOrCreate`` starts a fresh one (a few seconds).
"""

from __future__ import annotations

import contextlib
import subprocess
from typing import Any

JVM_EXIT_S = 60.0  # the JVM runs its shutdown hooks first: seconds on a loaded 2-core machine
# The tests' Spark drivers (a classic session's JVM, the Connect server) compile with C1 only, as the cluster tests'
# executors and daemons already do: on the 2-core machine C2's compiler threads compete with the JVM's start and the
# tests' short jobs (measured at load ~6: a session up in 7-8 s instead of 12-17 s, three small shuffles in 10 s
# instead of 16-18 s). Not for the benchmarks, whose figures are a deployed JVM's.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def stop_with_jvm(session: Any, timeout: float = JVM_EXIT_S) -> None:
    """Stop ``session``, then the gateway JVM it ran on (by closing its stdin, on which PySpark's gateway server
    exits; SIGKILL by its PID after ``timeout``), and forget the gateway so that the next session starts its own."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)  # set by pyspark's launch_gateway
    with contextlib.suppress(Exception):  # the py4j connections only: the JVM is ended below either way
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
