"""Kafka 0.9's topic tool in one long-lived JVM (``TopicServer.java``), for the tests' ``ZooKeeperAdmin``.

A JVM per topic operation (what ``globald demo`` does, rarely) costs 1.5-2.5 s of wall time and about 1.5 s of CPU;
the test suite creates and deletes hundreds of topics. ``TopicServer`` starts the JVM on first use, sends one
TopicCommand per line and reads one framed reply; it is compiled once per source version into ``build/``.
Not shipped in the wheel.
"""

from __future__ import annotations

import hashlib
import logging
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from globald.embedded.broker import kafka_home, stop_process
from tests.support.jvm_leaks import SCOPE_ENV

SOURCE = Path(__file__).with_name("TopicServer.java")
BUILD = Path(__file__).resolve().parents[2] / "build" / "topic-server"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0

log = logging.getLogger(__name__)
_compile_lock = threading.Lock()


class TopicServerUnavailable(Exception):
    """The server could not be built or started, or died during a request; the caller runs the command in a JVM
    of its own instead. Nothing for the operator to do; the reason is in the message (and the JVM's stderr)."""


def compiled_classes() -> Path:
    """The directory holding TopicServer.class for the current source, compiling it on first use.

    Keyed by the source's hash, so an edit recompiles; compiled into a temporary directory and renamed, so test
    processes compiling at once never see a half-written class."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    classes = BUILD / digest
    with _compile_lock:
        if (classes / "TopicServer.class").is_file():
            return classes
        javac = shutil.which("javac")
        if javac is None:
            raise TopicServerUnavailable("no javac on PATH")
        BUILD.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".compiling-", dir=BUILD))
        try:
            out = subprocess.run([javac, "--release", "11", "-nowarn", "-cp", f"{kafka_home()}/libs/*",
                                  "-d", str(staging), str(SOURCE)], capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise TopicServerUnavailable(f"javac failed: {out.stdout[-1000:]} {out.stderr[-1000:]}")
            try:
                staging.rename(classes)
            except OSError:  # another process got there first; its classes are the same
                if not (classes / "TopicServer.class").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return classes


class TopicServer:
    """One JVM running kafka.admin.TopicCommand's actions, one request at a time (thread-safe).

    ``run`` starts the JVM when none is running (again, if it died); ``stop`` closes its stdin, on which it exits.
    After a failed start it stays unavailable: every caller then falls back at once instead of paying a start."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None
        self._buf = bytearray()
        # GLOBALD_TEST_TOPIC_SERVER=0 runs every command in a JVM of its own, as before the server (to compare).
        self._broken: str | None = ("GLOBALD_TEST_TOPIC_SERVER=0" if os.environ.get("GLOBALD_TEST_TOPIC_SERVER") == "0"
                                    else None)
        self.last_exit: int | None = None  # the exit status of the last JVM stopped (0: it left on its own)

    @property
    def available(self) -> bool:
        """False once it could not start: commands then run in a JVM each."""
        return self._broken is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def run(self, args: list[str], timeout: float = 120.0) -> tuple[int, str, str]:
        """TopicCommand ``args`` → (exit status, stdout, stderr), as a JVM of its own would give them.

        Raises TopicServerUnavailable when the command cannot be sent here (see the class), and
        subprocess.TimeoutExpired, after stopping the JVM, when no reply came within ``timeout``."""
        if any("\t" in a or "\n" in a or "\r" in a for a in args):
            raise TopicServerUnavailable(f"an argument holds a tab or a line break: {args}")
        with self._lock:
            proc = self._ensure_started()
            assert proc.stdin is not None
            try:
                proc.stdin.write("\t".join(args).encode() + b"\n")
                proc.stdin.flush()
                deadline = time.monotonic() + timeout
                status, n_out, n_err = (int(f) for f in self._read_line(deadline).split())
                out = self._read_exactly(n_out, deadline).decode(errors="replace")
                err = self._read_exactly(n_err, deadline).decode(errors="replace")
                return status, out, err
            except subprocess.TimeoutExpired:
                self._stop_locked(grace=0)  # stuck in the command: no use waiting for it to read its stdin
                raise subprocess.TimeoutExpired(["TopicServer", *args], timeout) from None
            except (OSError, EOFError, ValueError) as e:
                # The JVM died (killed, out of memory, or an exit it could not refuse): the next call starts another.
                self._stop_locked()
                log.warning("the topic server died during %s (%r); that command runs in a JVM of its own", args, e)
                raise TopicServerUnavailable(f"the topic server died during {args}: {e!r}") from e

    def stop(self) -> None:
        with self._lock:
            self._stop_locked()

    # -- the JVM ----------------------------------------------------------------------------------------------

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop_locked()
        if self._broken is not None:
            raise TopicServerUnavailable(self._broken)
        try:
            classes = compiled_classes()
            home = kafka_home()
            # A temporary file for the JVM's own stderr (the commands' is captured in the JVM): a pipe nobody reads
            # would block it once full.
            self._stderr = tempfile.TemporaryFile(prefix="topic-server-")  # noqa: SIM115 (lives as long as the JVM)
            # C1 only: the JVM spends its life starting up and waiting, and the machine has 2 cores.
            self._proc = subprocess.Popen(
                ["java", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-cp", f"{classes}{os.pathsep}{home}/libs/*",
                 f"-Dlog4j.configuration=file:{home}/config/tools-log4j.properties", "TopicServer"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                start_new_session=True,  # a Ctrl-C reaches the tests, which stop it, not the JVM directly
                # the session broker's, whichever test started it: the suite's JVM check looks at the session's end
                env={**os.environ, SCOPE_ENV: "session"})
            self._buf.clear()
            if self._read_line(time.monotonic() + START_TIMEOUT) != "READY":
                raise EOFError("no READY line")
            return self._proc
        except (TopicServerUnavailable, OSError, EOFError, subprocess.TimeoutExpired) as e:
            self._broken = f"the topic server did not start: {e!r} {self._jvm_stderr()}"
            self._stop_locked()
            log.warning("%s; topic commands run in a JVM each", self._broken)
            raise TopicServerUnavailable(self._broken) from e

    def _stop_locked(self, grace: float = STOP_TIMEOUT) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                try:
                    if pipe is not None:
                        pipe.close()  # its stdin at EOF: the JVM exits on its own, at once
                except OSError:
                    pass
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                stop_process(proc, timeout=STOP_TIMEOUT)  # SIGTERM, then SIGKILL, for one stuck in a command
            self.last_exit = proc.returncode
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _jvm_stderr(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read()[-1000:].decode(errors="replace")

    def _fill(self, deadline: float) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise subprocess.TimeoutExpired(["TopicServer"], 0)
        chunk = os.read(fd, 65536)
        if not chunk:
            raise EOFError("the topic server closed its stdout")
        self._buf += chunk

    def _read_line(self, deadline: float) -> str:
        while (end := self._buf.find(b"\n")) < 0:
            self._fill(deadline)
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        return line.decode()

    def _read_exactly(self, n: int, deadline: float) -> bytes:
        while len(self._buf) < n:
            self._fill(deadline)
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data
