"""An upload cut short on an object store (the S3 emulator, moto) leaves no partial object under its name.

pyarrow's S3 output stream completes its upload as it closes, and it closes when an error leaves the ``with``
block (and in its destructor): a stop (``ExportStopped``) or a failed read of the snapshot file in the middle of a
file committed the bytes sent so far under the file's content-addressed name, which claims the whole. Measured
before the fix: 3 MiB of a 4 MiB file, and 12 MiB of a 16 MiB (multipart) one, stood at their names."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from globald.export.exporter import ExportStopped
from globald.export.target import Target
from tests.ci import require_module

MIB = 1 << 20


@pytest.fixture(scope="module")
def bucket_uri() -> Iterator[str]:
    """A bucket of the S3 emulator, written to directly (the chaos campaign's front is passed by)."""
    require_module("moto.server", "test")
    from tests.chaos.s3_faults import CREDENTIALS, S3Front

    with pytest.MonkeyPatch.context() as mp:  # the emulator's credentials, for this module only
        for k, v in CREDENTIALS.items():
            mp.setenv(k, v)
        front = S3Front().start()
        try:
            yield front.uri(front.new_bucket(), direct=True)
        finally:
            front.stop()


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
