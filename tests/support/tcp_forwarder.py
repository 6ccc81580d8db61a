"""A TCP forwarder for ``tests.support.wedge_probe --via-proxy``: a broker killed and restarted without the broker's
restart, so that cycles take seconds rather than a JVM's start. ``Proxy`` runs it as a process of its own; run
alone: ``python -m tests.support.tcp_forwarder LISTEN_PORT TARGET_PORT`` (127.0.0.1 both). Not shipped in the wheel.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time


def serve_proxy(listen: int, target: int) -> None:
    """A TCP forwarder 127.0.0.1:``listen`` -> 127.0.0.1:``target`` (``--via-proxy``): SIGKILLed, its connections end
    and its port refuses, as a killed broker's would, while the broker behind it keeps its state."""

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except OSError:
            pass
        finally:
            w.close()

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            br, bw = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, bw), pipe(br, cw))

    async def run() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", listen, reuse_address=True)
        async with server:
            await server.serve_forever()

    asyncio.run(run())


class Proxy:
    """The forwarder's process; ``kill`` and ``start`` stand for a broker SIGKILLed and restarted (same port, same
    data, and none of a real restart's window in which the broker answers with an empty cluster)."""

    def __init__(self, listen: int, target: int) -> None:
        self.listen, self.target = listen, target
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.tcp_forwarder",
                                      str(self.listen), str(self.target)], start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.listen), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"the proxy did not listen on {self.listen}")

    def kill(self) -> int | None:
        if self.proc is None:
            return None
        pid = self.proc.pid
        self.proc.kill()
        self.proc.wait()
        return pid


if __name__ == "__main__":
    serve_proxy(int(sys.argv[1]), int(sys.argv[2]))
