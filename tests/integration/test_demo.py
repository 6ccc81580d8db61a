"""`globald demo` end to end, as a user runs it: the installed command, no arguments, from another directory."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
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


@pytest.mark.timeout(960)  # the demo's own phase bounds (PHASE_TIMEOUT_S) decide; this only stops a hang
@pytest.mark.long  # over 30 s on an idle 2-core machine: the long lane (make test-long)
def test_demo_runs_end_to_end_from_any_directory(tmp_path: Path) -> None:
    started = time.monotonic()
    r = subprocess.run([GLOBALD, "demo"], cwd=tmp_path, capture_output=True, text=True, timeout=900,
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
    # The recreated topic and the in-process recovery: the fetch out of range (invalid offset) or the fingerprint
    # check (topic recreated), whichever sees it first, wipes the table once.
    assert re.search(r"table customers RUNNING -> RESTORING \((invalid offset|topic recreated), rebuilding: ", out)
    assert re.search(r"wipes \{'customers/(invalid_offset|topic_recreated)': 1\}", out)
    # Spark ran, or said clearly why not.
    assert re.search(r"Spark: enriched [\d,]+ orders|Spark step skipped: ", out)
    # The summary, with `globald status` and metrics read over HTTP.
    summary = out[out.index("summary:"):]
    assert re.search(r"globald: RUNNING \(pid \d+\), ready", summary)
    assert re.search(r"customers +RUNNING +p0=\d+, p1=\d+, p2=\d+, lag 0, 1 wipe\(s\)", summary)
    assert re.search(r'globald_wipes_total\{reason="(invalid_offset|topic_recreated)",table="customers"\} 1.0',
                     summary)
    assert "globald_ready 1.0" in summary
    work = work_dir(out)
    assert f"{work} removed" in out and not work.exists()
    assert not leftover_processes(str(work))
    assert list(tmp_path.iterdir()) == []  # nothing written where it was started
    print(f"globald demo took {took:.1f}s")


def test_demo_cleans_up_on_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C pressed again and again, as a person does while clean-up takes seconds: the first stops the demo, the
    others neither cut the clean-up short nor change the exit status (130). Waits on what the demo says and on its
    exit, each with a generous timeout; never on how long clean-up takes."""
    proc = subprocess.Popen([GLOBALD, "demo"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()

    def until(text: str, timeout: float, press_every: float | None = None) -> None:
        """Read output until a line holds ``text``; pressing Ctrl-C every ``press_every`` seconds meanwhile."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if press_every is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                line = lines.get(timeout=press_every or 1.0)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"the demo ended before saying {text!r}:\n{''.join(output)}")
            output.append(line)
            if text in line:
                return
        proc.kill()
        raise AssertionError(f"no {text!r} within {timeout:.0f}s:\n{''.join(output)}")

    until("table customers RESTORING -> RUNNING", timeout=300)
    # A signal that lands inside a blocking librdkafka call is acted on when it returns: press until the demo says so.
    until("interrupted; cleaning up", timeout=120, press_every=0.5)
    # And keep pressing through the whole clean-up and the exit: none of these may kill the process.
    presses = 0
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGINT)
        presses += 1
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        raise AssertionError(f"the demo did not exit within 180s of Ctrl-C:\n{''.join(output)}")
    while (line := lines.get(timeout=30)) is not None:
        output.append(line)
    said = "".join(output)
    assert proc.returncode == 130, f"exit {proc.returncode} after {presses} more Ctrl-C:\n{said}"
    # Pressed for a second or more, some landed while clean-up ran Python code, where the handler says it ignores them.
    assert presses < 20 or "still cleaning up; further Ctrl-C is ignored" in said, said
    work = work_dir(said)
    assert not work.exists()
    assert not leftover_processes(str(work))
