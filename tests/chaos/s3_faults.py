"""Export storage on the S3 emulator for the campaign's export events (``tests.chaos.exports``): moto's S3 server,
an emulator of S3 (not S3 itself), behind a front of the campaign's own that answers for it, or does not.

The front passes every request to the emulator, except those naming the object the campaign picked (a file of the
export a second daemon is downloading), or, for an upload, those of the methods picked (``PUT``/``POST``: objects
and multipart parts written, uploads completed) under a table's prefix, which get, by ``fail``:

- ``5xx``: ``503 Slow Down`` (S3's own answer to too many requests), every time, until healed;
- ``500``: ``500 InternalError``, S3's answer when it failed itself;
- ``silent``: nothing at all: the connection is taken and held open, as storage that never answers;
- ``cut``: half the request's body is read, then the connection is closed unanswered: a torn write.

The campaign copies a finished export from its ``file://`` storage into a bucket of its own (``mirror``): the
exporting daemon stays as it was, and what is tried on S3 is the download, where an object is read in place and
ranged, and the bootstrap's bound and refusals. Credentials come from the environment only, as in production.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import re
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from globald.export.target import EXPORTS_DIR, FILES_DIR

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "emulator", "AWS_SECRET_ACCESS_KEY": "emulator-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}
SILENT_MAX_S = 600.0  # a silent answer is given up after this, whatever happens (the front never outlives a run)
SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
INTERNAL = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
            b"<Message>We encountered an internal error. Please try again.</Message></Error>")
ERRORS = {"5xx": (503, "Slow Down", SLOW_DOWN), "500": (500, "Internal Server Error", INTERNAL)}
UPLOAD = ("PUT", "POST")  # what an upload sends: an object or a part written, a multipart upload begun or completed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Front:
    """The emulator and its front, started once per campaign (``start``) and stopped with it."""

    def __init__(self) -> None:
        self.mode = "pass"
        self.match = ""  # a regular expression: requests whose path it finds fail (an object name, a prefix)
        self.methods: tuple[str, ...] = ()  # and only these methods' (empty: all)
        self.failed = 0  # requests answered with the fault since the last ``fail``
        self.healed = threading.Event()
        self._moto: Any = None
        self._server: ThreadingHTTPServer | None = None
        self.backend = ""
        self.endpoint = ""

    def start(self) -> S3Front:
        from moto.server import ThreadedMotoServer  # the test extra: the campaign needs it for these events

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise, in the campaign's output
        port = free_port()
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        self._moto.start()
        self.backend = f"127.0.0.1:{port}"
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _any(self) -> None:
                if front.mode != "pass" and front.match and re.search(front.match, self.path) and \
                        (not front.methods or self.command in front.methods):
                    front.failed += 1
                    self._fail()
                    return
                self._forward(self._body())

            def _chunked(self) -> bool:
                return "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()

            def _body(self) -> bytes:
                """The request's body, de-chunked: an upload is sent with ``Transfer-Encoding: chunked``."""
                if not self._chunked():
                    length = int(self.headers.get("Content-Length") or 0)
                    return self.rfile.read(length) if length else b""
                out = bytearray()
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    out += self.rfile.read(size)
                    self.rfile.readline()
                while self.rfile.readline().strip():  # trailers, up to the empty line
                    pass
                return bytes(out)

            def _fail(self) -> None:
                if front.mode == "cut":  # half the body (or of its first chunk) taken, then the connection dropped
                    if self._chunked():
                        self.rfile.read(int(self.rfile.readline().split(b";")[0].strip() or b"0", 16) // 2)
                    else:
                        self.rfile.read(int(self.headers.get("Content-Length") or 0) // 2)
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self._body()
                if front.mode == "silent":  # held open, never answered; closed once healed
                    front.healed.wait(SILENT_MAX_S)
                    self.close_connection = True
                    return
                status, reason, body = ERRORS[front.mode]
                self.send_response(status, reason)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _forward(self, body: bytes) -> None:
                conn = http.client.HTTPConnection(front.backend, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("host", "connection", "transfer-encoding", "content-length")}
                    headers["Host"] = self.headers.get("Host") or front.backend  # signed: passed as sent
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                finally:
                    conn.close()
                self.send_response(r.status, r.reason)
                for k, v in r.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data) if self.command != "HEAD" else
                                                       int(r.getheader("Content-Length") or 0)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="chaos-s3-front", daemon=True).start()
        self.endpoint = f"127.0.0.1:{self._server.server_address[1]}"
        for k, v in CREDENTIALS.items():
            os.environ.setdefault(k, v)  # the campaign's own calls; the daemons get them by ``env``
        return self

    def stop(self) -> None:
        self.heal()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._moto is not None:
            self._moto.stop()

    def fail(self, mode: str, match: str, methods: tuple[str, ...] = ()) -> None:
        """Fail requests whose path ``match`` (a regular expression) finds, of ``methods`` only when given, by
        ``mode`` until ``heal``."""
        assert mode in ("silent", "cut", *ERRORS), mode
        self.healed.clear()
        self.failed = 0
        self.match, self.methods, self.mode = match, methods, mode

    def heal(self) -> None:
        self.mode, self.match, self.methods = "pass", "", ()
        self.healed.set()

    def new_bucket(self) -> str:
        """A bucket of its own for one event: ``s3://`` URIs through the front (for the daemons) and straight to
        the emulator (for the campaign's own copies and deletions)."""
        from globald.export.target import Target

        bucket = f"chaos-{uuid.uuid4().hex[:12]}"
        Target(self.uri(bucket, direct=True)).fs.create_dir(bucket)
        return bucket

    @staticmethod
    def uploads(table: str) -> str:
        """What ``fail`` matches for an upload fault: the writes of ``table``'s files (objects, multipart parts,
        completions) and manifests, not of its directory markers."""
        return rf"/{table}/({FILES_DIR}/[0-9a-f]|{EXPORTS_DIR}/[0-9])"

    def uri(self, bucket: str, direct: bool = False) -> str:
        endpoint = self.backend if direct else self.endpoint
        create = "&allow_bucket_creation=true" if direct else ""
        return f"s3://{bucket}/exports?endpoint_override={endpoint}&scheme=http{create}"


def mirror(src: Path, bucket_uri: str, table: str, export_ids: list[str]) -> int:
    """Copy exports ``export_ids`` of ``table`` from the ``file://`` storage at ``src`` into the bucket, files first
    and manifests last, as an exporter writes them; the files copied."""
    from globald.export.manifest import blob_name
    from globald.export.target import EXPORTS_DIR, FILES_DIR, Target

    target = Target(bucket_uri)
    base = src / table
    copied = 0
    for export_id in export_ids:
        manifest = base / EXPORTS_DIR / f"{export_id}.json"
        for f in json.loads(manifest.read_text())["files"]:
            blob = blob_name(f["sha256"], int(f["size"]))
            if target.size(table, FILES_DIR, blob) is None:
                target.put(_chunks(base / FILES_DIR / blob), table, FILES_DIR, blob)
                copied += 1
        target.put(_chunks(manifest), table, EXPORTS_DIR, manifest.name)
    return copied


def _chunks(path: Path) -> Any:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk


def delete(bucket_uri: str, *parts: str) -> None:
    from globald.export.target import Target

    with contextlib.suppress(FileNotFoundError):
        Target(bucket_uri).delete(*parts)


def whole_exports(bucket_uri: str, table: str) -> tuple[list[str], list[str]]:
    """The ids of the bucket's exports of ``table``, and what is wrong with them: a manifest that does not read, or
    names a file missing, of another size, or whose content does not hash to its name (what a bootstrap refuses)."""
    import hashlib

    from globald.export.exporter import live_manifests
    from globald.export.target import Target

    target = Target(bucket_uri)
    found, problems = live_manifests(target, table)
    for m in found:
        for f in m.files:
            size = target.size(table, FILES_DIR, f.blob)
            if size != f.size:
                problems.append(f"export {m.id} names {f.blob}: {'missing' if size is None else f'{size} bytes'}")
                continue
            digest = hashlib.sha256()
            for chunk in target.chunks(table, FILES_DIR, f.blob):
                digest.update(chunk)
            if digest.hexdigest() != f.sha256:
                problems.append(f"export {m.id} names {f.blob}: its content hashes to {digest.hexdigest()}")
    return [m.id for m in found], problems
