"""Durable changes to the file system: after a power loss, no name is found without its data.

Contract: when a function here returns, its change survives a power loss (the machine stops; whatever was only in
the page cache is gone) on a file system that honours fsync: ext4, XFS, btrfs. Until it returns, a power loss leaves
the old state or the new one, never a name whose data is missing. A file is written under a temporary dot-name in
the same directory, fsynced, renamed over its name, and then the directory is fsynced; every rename, mkdir and tree
removal here fsyncs the directories whose entries it changed. Without these fsyncs a renamed file is commonly found
empty after a power loss (XFS, or ext4 mounted ``noauto_da_alloc``).

A crash between the temporary file's creation and its rename may leave ``.tmp-<name>.*.tmp`` behind, and one during
``remove_tree`` a ``.trash-<name>`` directory: dot-names no reader of globald's directories looks at, removed by
``clear_leftovers`` (a table's, when its store is opened) or the snapshot publisher's start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from globald.store.names import TMP_PREFIX, TMP_SUFFIX, TRASH_PREFIX


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (names created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes | str, *, durable: bool = True, mode: int = 0o600) -> None:
    """Replace ``path`` atomically with ``data`` (str is written as UTF-8): readers see the old or the new content.

    With ``durable`` (the default), the new content is on disk when this returns. ``durable=False`` keeps the
    atomicity against a crash of the process but not against a power loss, after which the file may be missing,
    empty or old: pass it only where that harms nothing, and say why at the call site.
    """
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode != 0o600:  # mkstemp creates 0600
                os.fchmod(f.fileno(), mode)
            f.write(raw)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def make_dirs(path: Path, mode: int = 0o700) -> None:
    """``mkdir -p path``, durably: the parent of ``path`` and of every directory created is fsynced.

    The parent of an existing ``path`` is fsynced too: a process killed between its mkdir and that fsync may have
    left the entry in the page cache only.
    """
    missing: list[Path] = []
    p = path
    while not p.is_dir():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=mode)
        except FileExistsError:
            if not d.is_dir():
                raise
        fsync_dir(d.parent)
    if not missing:
        fsync_dir(path.parent)


def rename(src: Path, dst: Path) -> None:
    """``os.rename(src, dst)``, durable: the directories of both names are fsynced.

    The caller makes what ``src`` holds durable first (``sync_tree`` for a directory, ``replace_file`` for a file)."""
    os.rename(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)


def claim(src: Path, dst: Path) -> None:
    """``os.rename(src, dst)`` to take a request file for oneself: after it, whoever wrote ``src`` can no longer
    withdraw it. Not made durable, on purpose: the rename decides who handles the request, not what any file holds,
    and the caller that claims (the daemon's loop thread) must not wait on the disk for it. Raises
    FileNotFoundError when ``src`` is gone (withdrawn, or claimed already)."""
    os.rename(src, dst)


def sync_tree(path: Path, *, synced_suffixes: tuple[str, ...] = ()) -> None:
    """fsync every file and directory under ``path`` and ``path`` itself, contents before their directory.

    For a directory tree written without fsyncs (a copy, a checkpoint, a build) before it is renamed into place.
    A file named ``*<suffix>`` for a suffix in ``synced_suffixes`` is taken as durable already and only its directory
    is fsynced: RocksDB fsyncs each table file (``.sst``) it writes before naming it, and a hard link to one adds only
    a directory entry (with the link count, in the same journal transaction)."""

    def fail(e: OSError) -> None:  # os.walk skips what it cannot list; an unsynced subtree must not pass silently
        raise e

    for root, _dirs, files in os.walk(path, topdown=False, onerror=fail):
        for name in files:
            if synced_suffixes and name.endswith(synced_suffixes):
                continue
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


def remove_tree(path: Path, trash: Path | None = None) -> bool:
    """Delete directory ``path`` so that a power loss never finds it half-deleted under its name.

    It is renamed to ``trash`` (default ``.trash-<name>`` beside it, emptied first if an earlier removal was cut
    short), the rename made durable, and only then deleted. Returns False when ``path`` does not exist. Raises
    OSError when the rename fails (``path`` is then untouched); a failure while deleting the trash is ignored.
    """
    trash = trash or path.with_name(f"{TRASH_PREFIX}{path.name}")
    shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)
    return True


def clear_leftovers(path: Path) -> None:
    """Remove what a crash left of ``remove_tree(path)`` (its trash beside ``path``) and of ``replace_file`` calls in
    directory ``path`` (their temporary files). Only where nothing else writes meanwhile: under the state_dir lock."""
    shutil.rmtree(path.with_name(f"{TRASH_PREFIX}{path.name}"), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        for e in os.scandir(path):
            if e.name.startswith(TMP_PREFIX) and e.name.endswith(TMP_SUFFIX) and e.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
