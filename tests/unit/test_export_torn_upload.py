"""An upload cut short on an object store (the S3 emulator, moto) leaves no partial object under its name.

pyarrow's S3 output stream completes its upload as it closes, and it closes when an error leaves the ``with``
block (and in its destructor): a stop (``ExportStopped``) or a failed read of the snapshot file in the middle of a
file committed the bytes sent so far under the file's content-addressed name, which claims the whole. Measured
before the fix: 3 MiB of a 4 MiB file, and 12 MiB of a 16 MiB (multipart) one, stood at their names."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import pytest

from globald.export.exporter import ExportStopped
from globald.export.target import Target
from tests.ci import require_module

MIB = 1 << 20


@pytest.fixture(scope="module")
def bucket_uri() -> Iterator[str]:
    moto_server = require_module("moto.server", "test")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ACCESS_KEY_ID": "emulator", "AWS_SECRET_ACCESS_KEY": "emulator-secret",
                     "AWS_DEFAULT_REGION": "us-east-1"}.items():
            mp.setenv(k, v)
        bucket = f"torn-{uuid.uuid4().hex[:12]}"
        uri = f"s3://{bucket}/exports?endpoint_override=127.0.0.1:{port}&scheme=http&allow_bucket_creation=true"
        Target(uri).fs.create_dir(bucket)
        try:
            yield uri
        finally:
            server.stop()


def _cut(whole: int, after: int, error: BaseException) -> Iterator[bytes]:
    sent = 0
    while sent < whole:
        if sent >= after:
            raise error
        yield b"x" * MIB
        sent += MIB


@pytest.mark.parametrize(("whole", "error"), [(4 * MIB, ExportStopped("stopping")),
                                              (16 * MIB, OSError(5, "Input/output error"))])
def test_an_upload_cut_short_leaves_no_partial_object(bucket_uri: str, whole: int, error: BaseException) -> None:
    target = Target(bucket_uri)
    assert target.fs.type_name == "s3"
    name = f"blob-{whole}"
    with pytest.raises(type(error)):
        target.put(_cut(whole, whole - MIB, error), "tbl", "files", name, size=whole)
    assert target.size("tbl", "files", name) is None  # before the fix: whole - MIB bytes under the name
    # Written whole afterwards, as the next export does (the size differs, so it uploads the file again).
    assert target.put(_cut(whole, whole, error), "tbl", "files", name, size=whole) == whole
    assert target.size("tbl", "files", name) == whole
