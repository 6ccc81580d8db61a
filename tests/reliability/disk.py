"""Disks that misbehave on demand: a small tmpfs to fill up, a read-only bind mount. Both need CAP_SYS_ADMIN;
callers decide what to do without it (the suite skips with the reason unless it runs as root or in CI, where it
fails; the soak leaves the fault out).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def mount_tmpfs(path: Path, size_mb: int) -> str | None:
    """Mount a tmpfs of ``size_mb`` at ``path``; None on success, else why not."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


@contextmanager
def tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` mounted at ``path`` for a test, unmounted after. Where it cannot be mounted the test
    skips, except as root or in CI, where a mount that fails is a failure (``tests.ci.unavailable``)."""
    why = mount_tmpfs(path, size_mb)
    if why is not None:
        from tests.ci import unavailable  # only tests call this; the soak decides for itself

        unavailable(f"cannot mount a {size_mb} MB tmpfs to fill up (needs root or CAP_SYS_ADMIN): {why}",
                    fail_as_root=True)
    try:
        yield path
    finally:
        unmount(path)


def resize(path: Path, size_mb: int) -> None:
    """Grow (or shrink) the tmpfs at ``path`` in place: room returning, as an operator would give it."""
    subprocess.run(["mount", "-o", f"remount,size={size_mb}m", str(path)], check=True, capture_output=True)


def bind_read_only(path: Path) -> str | None:
    """Make ``path`` a read-only bind mount of itself; None on success, else why not."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "--bind", "-o", "ro", str(path), str(path)], capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"mount exited {r.returncode}")


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


def fill(disk: Path, leave: int) -> Path:
    """A file taking all but about ``leave`` bytes; stops quietly if others fill the rest first."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb") as f:
        while True:
            st = os.statvfs(disk)
            room = st.f_bavail * st.f_frsize - leave
            if room <= 0:
                break
            try:
                f.write(chunk[:room])
                f.flush()
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    return filler


def copy_what_fits(src: Path, dst: Path) -> int:
    """Copy the files of the directory ``src`` into ``dst`` until the disk refuses one (ENOSPC or EDQUOT), whose
    partial copy is removed; returns the bytes copied. For a test that fills its disk with a copy: a full disk is
    what it wanted, so one that fills before the copy ends is no failure of the test's own step."""
    dst.mkdir(parents=True, exist_ok=True)
    copied = 0
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        target = dst / f.name
        try:
            with open(f, "rb") as i, open(target, "wb") as o:
                while block := i.read(1 << 20):
                    o.write(block)
                o.flush()
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            target.unlink(missing_ok=True)
            break
        copied += f.stat().st_size
    return copied
