"""`globald demo` end to end, as a user runs it: the installed command, no arguments, from another directory."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka

GLOBALD = str(Path(sys.executable).parent / "globald")


def work_dir(output: str) -> Path:
    m = re.search(r"everything lives in (\S+) and is removed", output)
    assert m, output
    return Path(m.group(1))


def leftover_processes(marker: str) -> list[str]:
    """Command lines of live processes that mention ``marker`` (the demo's JVMs run from its work dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(cmdline[:200])
    return found


def test_demo_runs_end_to_end_from_any_directory(tmp_path: Path) -> None:
    started = time.monotonic()
    r = subprocess.run([GLOBALD, "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": ""})
    took = time.monotonic() - started
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "Kafka up on 127.0.0.1:" in out
    assert "topic customers: compacted, 3 partitions, seeded with 200,000 records" in out
    # The daemon's state changes, restore progress and a checked store.
    assert "daemon CREATED -> RESTORING (starting)" in out
    assert "table customers RESTORING -> RUNNING (restored to the log end)" in out
    assert re.search(r"customers: restored 200,000 records in [\d.]+s", out)
    assert len(re.findall(r"check: store == fold of the topic .*keys ✓", out)) == 2
    # The invalid offset and the in-process recovery.
    assert re.search(r"table customers RUNNING -> RESTORING \(invalid offset, rebuilding: invalid offset", out)
    assert "wipes {'customers/invalid_offset': 1}" in out
    # Spark ran, or said clearly why not.
    assert re.search(r"Spark: enriched [\d,]+ orders|Spark step skipped: ", out)
    # The summary, with `globald status` and metrics read over HTTP.
    summary = out[out.index("summary:"):]
    assert re.search(r"globald: RUNNING \(pid \d+\), ready", summary)
    assert re.search(r"customers +RUNNING +p0=\d+, p1=\d+, p2=\d+, lag 0, 1 wipe\(s\)", summary)
    assert 'globald_wipes_total{reason="invalid_offset",table="customers"} 1.0' in summary
    assert "globald_ready 1.0" in summary
    work = work_dir(out)
    assert f"{work} removed" in out and not work.exists()
    assert not leftover_processes(str(work))
    assert list(tmp_path.iterdir()) == []  # nothing written where it was started
    print(f"globald demo took {took:.1f}s")


def test_demo_cleans_up_on_ctrl_c(tmp_path: Path) -> None:
    proc = subprocess.Popen([GLOBALD, "demo"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "table customers RESTORING -> RUNNING" in line:
            break
    work = work_dir("".join(lines))
    # Python acts on a signal between bytecodes; one that lands inside a blocking librdkafka call can be held
    # until it returns, so press Ctrl-C again, as a person would, until the demo reacts.
    rest = ""
    for _ in range(30):
        proc.send_signal(signal.SIGINT)
        try:
            rest, _ = proc.communicate(timeout=2)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        rest, _ = proc.communicate(timeout=120)
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "interrupted; cleaning up" in output
    assert not work.exists()
    assert not leftover_processes(str(work))
