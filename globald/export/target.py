"""The shared storage exports live in: any pyarrow filesystem URI (file://, s3://, gs://, hdfs://, abfs://).

Credentials come from the environment or the platform, as each pyarrow filesystem documents it (AWS_* variables or
an instance profile for S3, GOOGLE_APPLICATION_CREDENTIALS for GCS, Kerberos for HDFS...), never from the config.
A URI may still carry a user, a password or query options (``s3://key:secret@bucket``, ``?access_key=``): it is
never logged or shown as written, only as ``masked`` makes it.

Layout under the URI's path, per table (table names are validated by the config, so they are safe path parts)::

    <table>/files/<sha256>-<size>     file contents, content-addressed: never rewritten with other bytes
    <table>/exports/<id>.json         one export's manifest, written last: an export without one does not exist
    <table>/retired/<id>@<ms>.json    a manifest retention dropped, kept for the grace period (see ``retention``)

On file systems (local, NFS, HDFS) every file is written under a dot-name and renamed to its name, so that a name
is only ever seen whole; object stores make an object visible whole once its upload completes, so it is written in
place (their move is a copy).
"""

from __future__ import annotations

import contextlib
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from globald.store.names import TMP_PREFIX

FILES_DIR = "files"
EXPORTS_DIR = "exports"
RETIRED_DIR = "retired"
MANIFEST_SUFFIX = ".json"
CHUNK = 1 << 20  # bytes read or written at a time: a stop or a deadline is seen between two chunks


class TargetError(Exception):
    """The export storage cannot be reached or refused an operation. Check the URI, the network and the
    credentials in the environment; the daemon keeps serving, and the next interval tries again."""


def masked(uri: str) -> str:
    """``uri`` without what may be secret: user info and query become ``***``."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparsable URI>"
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"***@{host}" if parts.username is not None or parts.password is not None else parts.netloc
    return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))


# Threads that may be inside a storage call (the bootstraps, the exporter): pyarrow's S3 client, finalized at
# interpreter exit, waits for every request in flight, so a process with one of them still alive would hang there.
STORAGE_THREADS = ("globald-bootstrap-", "globald-download-", "globald-export")


def storage_calls_in_flight() -> list[str]:
    """Names of the storage threads still alive (each abandoned by its bound or by the stop)."""
    import threading

    return sorted(t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith(STORAGE_THREADS))


def scrubbed(text: str, uri: str) -> str:
    """``text`` (an error about ``uri``) with the URI, its user info and every query value replaced by ``***``."""
    text = text.replace(uri, masked(uri))
    try:
        parts = urlsplit(uri)
    except ValueError:
        return text
    found = [parts.username, parts.password, *(v for _, _, v in (q.partition("=") for q in parts.query.split("&")))]
    for secret in sorted((x for x in found if x and len(x) > 2), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def check_uri(uri: str, timeout_s: float = 10.0) -> None:
    """Raise ValueError (with a scrubbed reason) when pyarrow cannot make a filesystem of ``uri`` at all: an
    unknown scheme, or a query option it does not take. Storage that is only unreachable (an OSError, or no answer
    within ``timeout_s``: opening an S3 URI without a region asks the bucket's) is not refused here."""
    import threading

    if _plain_local(uri):
        return  # pyarrow takes any such URI; importing it here cost a second import of it at every start (issue 44)
    from pyarrow import fs

    refused: list[str] = []

    def attempt() -> None:
        try:
            fs.FileSystem.from_uri(uri)
        except ValueError as e:  # pyarrow's ArrowInvalid is one
            refused.append(scrubbed(str(e), uri))
        except Exception:  # unreachable now is a runtime matter (the daemon falls back), not the config's
            pass

    worker = threading.Thread(target=attempt, name="globald-check-export-uri", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if refused:
        raise ValueError(refused[0])


_PLAIN_PATH = re.compile(r"/[A-Za-z0-9._~/+=,@:-]*")  # no percent escapes, no "//" start: pyarrow's parse is plain


def _plain_local(uri: str) -> bool:
    """``uri`` is a local directory URI every pyarrow takes (``file:///abs/path``: no host, no query, no escapes),
    so that checking it needs no pyarrow."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return False
    return (parts.scheme == "file" and parts.netloc == "" and not parts.query and not parts.fragment
            and uri == f"file://{parts.path}" and _PLAIN_PATH.fullmatch(parts.path) is not None
            and not parts.path.startswith("//"))


@dataclass(frozen=True)
class Entry:
    name: str  # base name
    size: int
    mtime: float | None  # epoch seconds, where the filesystem says


class Target:
    """One export root; safe to use from one thread at a time (each worker opens its own)."""

    def __init__(self, uri: str) -> None:
        from pyarrow import fs

        self.uri = uri
        self.shown = masked(uri)
        try:
            self.fs, root = fs.FileSystem.from_uri(uri)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError...; its text may quote the URI
            raise TargetError(f"cannot open export storage {self.shown}: {type(e).__name__}: "
                              f"{scrubbed(str(e), uri)}") from None
        self.root = root.rstrip("/")
        # Object stores make an object visible whole when its upload completes, and their move is a copy: written
        # in place. File systems (local, NFS, HDFS) show a file while it is written: written aside, then renamed.
        self._aside = self.fs.type_name in ("local", "hdfs")

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def list(self, *parts: str) -> list[Entry]:
        """Files directly under ``parts`` (dot-names left out); empty when the directory does not exist."""
        from pyarrow import fs

        sel = fs.FileSelector(self.path(*parts), allow_not_found=True)
        out = []
        for info in self._call("list", self.fs.get_file_info, sel):
            if info.type != fs.FileType.File or info.base_name.startswith("."):
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            out.append(Entry(info.base_name, int(info.size or 0), mtime))
        return out

    def size(self, *parts: str) -> int | None:
        """The size of a file, None when there is none."""
        from pyarrow import fs

        info = self._call("stat", self.fs.get_file_info, self.path(*parts))
        return int(info.size or 0) if info.type == fs.FileType.File else None

    def read(self, *parts: str, limit: int) -> bytes:
        """A whole small file, refused beyond ``limit`` bytes."""
        with self._call("open", self.fs.open_input_stream, self.path(*parts)) as f:
            raw = self._call("read", f.read, limit + 1)  # an object store asks for the object here, not at open
        if len(raw) > limit:
            raise TargetError(f"{'/'.join(parts)} is larger than {limit} bytes")
        return bytes(raw)

    def chunks(self, *parts: str) -> Iterator[bytes]:
        with self._call("open", self.fs.open_input_stream, self.path(*parts)) as f:
            while True:
                chunk = self._call("read", f.read, CHUNK)
                if not chunk:
                    return
                yield bytes(chunk)

    def put(self, data: Iterator[bytes], *parts: str, size: int | None = None) -> int:
        """Write ``data`` at ``parts``; returns the bytes written. On a file system under a dot-name beside it, then
        moved there. On an object store in place: pyarrow's stream completes the upload as it closes, even when an
        error (a stop, a failed read, a part refused) closes it, so a write cut short would stand there partial,
        under a name that claims the whole; given ``size`` (what a whole one holds), an object then found there at
        any other size is deleted (one at that size is whole: another host's, or this one's)."""
        final = self.path(*parts)
        tmp = self.path(*parts[:-1], f"{TMP_PREFIX}{secrets.token_hex(8)}-{parts[-1]}") if self._aside else final
        self._call("mkdir", self.fs.create_dir, self.path(*parts[:-1]), recursive=True)
        n = 0
        try:
            with self._call("create", self.fs.open_output_stream, tmp) as out:
                for chunk in data:
                    out.write(chunk)
                    n += len(chunk)
            if tmp != final:
                self._call("move", self.fs.move, tmp, final)
        except BaseException:
            if tmp != final:
                with contextlib.suppress(Exception):  # best effort: a dot-name nobody reads
                    self.fs.delete_file(tmp)
            elif size is not None:
                self._drop_torn(final, size)
            raise
        return n

    def _drop_torn(self, path: str, size: int) -> None:
        """Delete the object at ``path`` unless it holds ``size`` bytes. Best effort: the storage that refused the
        write may refuse this too; a torn object left behind is named by no manifest of this host (the manifest is
        written after its files), re-uploaded by the next export (its size differs) and refused by a bootstrap."""
        from pyarrow import fs

        with contextlib.suppress(Exception):
            info = self.fs.get_file_info(path)
            if info.type == fs.FileType.File and info.size != size:
                self.fs.delete_file(path)

    def move(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        self._call("mkdir", self.fs.create_dir, self.path(*dst[:-1]), recursive=True)
        self._call("move", self.fs.move, self.path(*src), self.path(*dst))

    def delete(self, *parts: str) -> None:
        self._call("delete", self.fs.delete_file, self.path(*parts))

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as e:  # the text of pyarrow's errors names paths, never the URI's user info or query
            text = _clean(str(e), self.uri)
            if isinstance(e, OSError) and _GONE.search(text):  # S3 says so in its own words, not as ENOENT
                raise FileNotFoundError(f"export storage {self.shown}: {what}: {text}") from None
            raise TargetError(f"export storage {self.shown}: {what} failed: {text}") from None


# How pyarrow's S3 filesystem says that an object is not there (another host's retention removed it meanwhile):
# callers take it as they take a file gone from a local directory (FileNotFoundError). A read of an object deleted
# after its stream opened may get a 404 without an error body, which the AWS SDK names RESOURCE_NOT_FOUND (seen in
# CI: a download racing another host's retention, grace_s = 0).
_GONE = re.compile(r"NO_SUCH_KEY|NoSuchKey|The specified key does not exist|RESOURCE_NOT_FOUND")
_SECRETISH = re.compile(r"(?i)(secret|password|token|key)=[^&\s]+")


def _clean(text: str, uri: str) -> str:
    """An error's text without the URI as written (it may hold user info) nor anything that looks like a secret."""
    return _SECRETISH.sub(r"\1=***", text.replace(uri, masked(uri)))
