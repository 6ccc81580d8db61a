"""The suite's check that no JVM outlives what started it (``tests/support/jvm_leaks.py``), run on a small pytest
session of its own that leaks on purpose. The "JVMs" are ``sleep`` run through a link named ``java`` (what
``/proc/<pid>/comm`` shows of a JVM), so that the check is shown without a real JVM's start and memory."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO
from tests.support import jvm_leaks

COMMON = '''
import os, subprocess, pytest

JAVA = os.environ["FAKE_JAVA"]


def note(pid, kind):
    with open(os.environ["PIDS_FILE"], "a") as f:
        f.write(f"{pid} {kind} {os.environ['PYTEST_RUN_MARK']}\\n")


def detached(env=None):
    """Started through a shell that exits at once: reparented (to PID 1 or a subreaper), no longer a child."""
    out = subprocess.run(["sh", "-c", f"{JAVA} 600 </dev/null >/dev/null 2>&1 & echo $!"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return int(out)
'''

INNER = {
    "test_1_session.py": COMMON + '''

def test_holds_one_for_the_session():  # tagged: checked at the session's end, not this module's
    note(detached({**os.environ, "PYTEST_JVM_SCOPE": "session"}), "session")
''',
    "test_2_fixtures.py": COMMON + '''

@pytest.fixture(scope="module")
def good_server():
    p = subprocess.Popen([JAVA, "600"])
    note(p.pid, "good")
    yield p
    p.kill()
    p.wait()


@pytest.fixture(scope="module")
def leaky_server():
    p = subprocess.Popen([JAVA, "600"])
    note(p.pid, "leaky-fixture")
    yield p  # never stopped


def test_a_uses_a_server_stopped_at_the_end(good_server):
    pass


def test_b_uses_the_leaky_fixture(leaky_server, good_server):
    pass
''',
    "test_3_tests.py": COMMON + '''

def test_a_leaks_a_child():
    note(subprocess.Popen([JAVA, "600"]).pid, "leaky-test")


def test_b_leaks_an_orphan():
    note(detached(), "orphan")


def test_c_another_runs_process_is_left_alone():
    note(detached({**os.environ, "PYTEST_RUN_MARK": "another-run"}), "foreign")


def test_d_stops_what_it_starts():
    p = subprocess.Popen([JAVA, "600"])
    p.terminate()
    p.wait()
''',
    "test_4_last.py": COMMON + '''

@pytest.fixture(scope="module")
def leaky_last():  # torn down at the session's end: named as the fixture still, not as the session
    note(subprocess.Popen([JAVA, "600"]).pid, "leaky-last")


def test_nothing(leaky_last):
    pass
''',
}

# The wait the plugin gives a JVM told to stop: each leak found costs all of it (three in the first test). Every
# process these inner tests stop is killed and reaped before its teardown is checked, so none needs the wait to be
# seen gone; the leaks never exit, whatever the wait.
CONFTEST = "import tests.support.jvm_leaks as j\nj.EXIT_WAIT_S = 0.5\n"


def _alive(pid: int) -> bool:
    return jvm_leaks._start_time(pid) is not None


def _inner(tmp_path: Path, files: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str],
                                                                        list[tuple[int, str, str]]]:
    """Runs pytest with the plugin on ``files`` in ``tmp_path``: its result and the (pid, kind, marker) noted."""
    java = tmp_path / "bin" / "java"
    java.parent.mkdir()
    sleep = shutil.which("sleep")
    assert sleep is not None
    java.symlink_to(sleep)
    for name, text in {**files, "conftest.py": CONFTEST}.items():
        (tmp_path / name).write_text(text)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "FAKE_JAVA": str(java), "PIDS_FILE": str(pids_file), "PYTHONPATH": str(REPO)}
    env.pop(jvm_leaks.MARKER_ENV, None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.support.jvm_leaks", "-p", "no:cacheprovider",
                        "-q", "-rA", *args, *files], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=240)
    noted = [(int(p), kind, marker) for p, kind, marker in
             (line.split() for line in pids_file.read_text().splitlines())] if pids_file.exists() else []
    return r, noted


def _cleanup(noted: list[tuple[int, str, str]]) -> None:
    for pid, _, _ in noted:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _errors(out: str) -> dict[str, str]:
    """Each teardown error's test name -> its report's text."""
    parts = re.split(r"_+ ERROR at teardown of (\w+) _+", out)
    return {parts[k]: parts[k + 1].split("= short test summary")[0] for k in range(1, len(parts), 2)}


def test_a_jvm_outliving_its_owner_fails_that_teardown_and_is_killed(tmp_path: Path) -> None:
    r, noted = _inner(tmp_path, INNER)
    try:
        out = r.stdout
        assert r.returncode == 1, out + r.stderr
        pid = {kind: p for p, kind, _ in noted}
        assert set(pid) == {"session", "good", "leaky-fixture", "leaky-test", "orphan", "foreign", "leaky-last"}, noted
        errors = _errors(out)
        assert set(errors) == {"test_b_uses_the_leaky_fixture", "test_d_stops_what_it_starts", "test_nothing"}, out
        # At the end of each module: its fixture's JVM, and those its tests started (by the test they started in).
        fixture_end, module_end = errors["test_b_uses_the_leaky_fixture"], errors["test_d_stops_what_it_starts"]
        assert f"module-scoped fixture 'leaky_server': pid {pid['leaky-fixture']} " in fixture_end, fixture_end
        assert f"a test of this module: pid {pid['leaky-test']} " in module_end, module_end
        assert "started during test_3_tests.py::test_a_leaks_a_child (call)" in module_end, module_end
        assert f"a test of this module: pid {pid['orphan']} (parent " in module_end, module_end
        # The one held for the session: not at its module's end, at the session's.
        assert f"pid {pid['session']} " not in fixture_end + module_end
        assert f"the session: pid {pid['session']} " in errors["test_nothing"], errors["test_nothing"]
        assert f"module-scoped fixture 'leaky_last': pid {pid['leaky-last']} " in errors["test_nothing"]
        for kind in ("session", "leaky-fixture", "leaky-test", "orphan", "leaky-last"):
            assert not _alive(pid[kind]), f"the leaked {kind} was not killed"
        # Only this run's: the good fixture's JVM is never named, another run's is neither named nor killed.
        assert f"pid {pid['good']} " not in out and f"pid {pid['foreign']} " not in out, out
        assert _alive(pid["foreign"])
    finally:
        _cleanup(noted)


def test_each_xdist_worker_checks_its_own_marker(tmp_path: Path) -> None:
    leak = ("import os, subprocess\n\ndef test_leaks():\n    p = subprocess.Popen([os.environ['FAKE_JAVA'], '600'])\n"
            "    open(os.environ['PIDS_FILE'], 'a').write(f\"{p.pid} leak {os.environ['PYTEST_RUN_MARK']}\\n\")\n")
    r, noted = _inner(tmp_path, {"test_one.py": leak, "test_two.py": leak}, "-n", "2", "--dist", "loadfile")
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        assert len(re.findall(r"ERROR at teardown of test_leaks", r.stdout)) == 2, r.stdout
        assert all(f"pid {pid} " in r.stdout for pid, _, _ in noted), r.stdout
        assert len(noted) == 2 and len({marker for _, _, marker in noted}) == 2, noted  # one marker per worker
        assert not any(_alive(pid) for pid, _, _ in noted)
    finally:
        _cleanup(noted)
