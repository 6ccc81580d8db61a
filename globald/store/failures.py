"""RocksDB and file-system errors mapped to globald's exception types, in one place.

rocksdict raises a bare ``Exception`` carrying RocksDB's status text. Text naming damaged or unreadable files
means the store cannot be trusted (it is wiped and rebuilt); everything else (no space, I/O error, a lock) is a
disk that may heal, which a wipe would not fix and which must never cost data. The one way to write is ``writes``;
the process-wide count of writes RocksDB held back is ``stalls``.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager

from globald.common.errors import GlobaldError, StoreCorruptError, StoreIOError, StoreUnavailableError

# Errors of the disk or of a store, which the loop answers by rewinding to the stored offsets, never by ending. Only
# globald's own types: every store and file call maps what it raises where it is made (``store_io``, ``classify``),
# so an OSError from anything else (a bug, a library) is not taken for a disk that may heal and retried forever
# without a word; it ends the loop in ERROR, with its traceback in the log.
STORE_FAULTS = (StoreUnavailableError, StoreCorruptError)

# RocksDB status prefixes that mean "these files are not a usable database".
CORRUPTION_MARKERS = ("Corruption", "Invalid argument", "Not implemented", "Unknown", "does not exist",
                      "No such file or directory")  # a file the database refers to (CURRENT exists) is missing
_NO_SPACE = "No space left"  # strerror(ENOSPC), in RocksDB's status text as in the OS's


def classify(error: BaseException, context: str) -> GlobaldError:
    """The globald exception that ``error``, raised while doing ``context``, stands for."""
    if isinstance(error, GlobaldError):
        return error
    text = f"{context}: {error}"
    if not isinstance(error, OSError) and is_corruption(str(error)):
        return StoreCorruptError(text)
    return StoreIOError(text)


def is_corruption(text: str) -> bool:
    return any(m in text for m in CORRUPTION_MARKERS)


def out_of_space(error: BaseException) -> bool:
    """``error`` says the disk is full: ENOSPC from the OS, or RocksDB's status text for it (which rocksdict
    raises as a bare Exception, and a mapped error keeps in its message)."""
    return (isinstance(error, OSError) and error.errno == errno.ENOSPC) or _NO_SPACE in str(error)


@contextmanager
def store_io(context: str) -> Iterator[None]:
    """Re-raise any store or file error inside the block as StoreCorruptError or StoreIOError."""
    try:
        yield
    except GlobaldError:
        raise
    except Exception as e:
        raise classify(e, context) from e
