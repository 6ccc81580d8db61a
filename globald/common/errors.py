"""Exceptions an operator may meet. Each docstring says what to do about it."""

from __future__ import annotations


class GlobaldError(Exception):
    """Base class of globald's own errors."""


class ConfigError(GlobaldError):
    """The config file is invalid. Fix the key named in the message; nothing on disk was touched."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class UsageError(GlobaldError):
    """An argument on the command line is malformed (a KEY that is not valid hex, say). Fix it and run again."""


class RefusedError(GlobaldError):
    """globald refused to act, on purpose, and changed nothing; the message says why and what would allow it."""


class StateDirLockedError(RefusedError):
    """Another globald already owns this state_dir. Stop it first, or give this instance its own state_dir."""


class StateDirError(GlobaldError):
    """The state_dir cannot be created or written. Fix its ownership and permissions (globald wants mode 0700)."""


class StoreCorruptError(GlobaldError):
    """A table's store cannot be opened as a globald store. The daemon wipes and rebuilds it from the topic."""


class StoreFormatError(StoreCorruptError):
    """The store was written by a newer globald in a format this one cannot read. The daemon rebuilds it from the
    topic; to keep it instead, run the newer globald again."""


class StoreUnavailableError(GlobaldError):
    """A store could not be opened for a reason a wipe would not fix (locked, I/O error). Check the disk."""


class StoreIOError(StoreUnavailableError):
    """The disk refused a store write, flush or file update (full, read-only, failing). Nothing that was not durable
    is claimed: the daemon reports itself degraded, keeps serving what is durable, and resumes from the stored
    offsets once the disk takes writes again. Free space or repair the disk; no restart is needed."""


class UnknownTableError(GlobaldError):
    """The table named is not in the config. Check the spelling against the [[tables]] entries."""


class ImportRefusedError(RefusedError):
    """A store cannot be imported as it is; the message says why and nothing was changed. Fix the cause, or let
    globald restore the table from its topic."""


class SnapshotError(GlobaldError):
    """A snapshot cannot be served. The message says why."""


class SnapshotNotFoundError(SnapshotError):
    """No snapshot with that id, or none published yet. List them with ``globald snapshots``; the daemon publishes
    one once the table is RUNNING."""


class ManifestError(SnapshotError):
    """A snapshot's manifest is missing, truncated or invalid. Readers skip that snapshot and the daemon
    garbage-collects it; check the disk if it keeps happening."""


class ManifestIOError(ManifestError):
    """The disk refused to read a snapshot's manifest (an I/O error, not bad content). Readers skip the snapshot
    for now; the daemon keeps it and reads it again later. Check the disk."""


class SnapshotStaleError(SnapshotError):
    """The current snapshot predates a rebuild of its table and ``[snapshots] serve_stale`` is false. Wait until the
    table is RUNNING again, or set serve_stale = true to read the stale snapshot."""


class SnapshotUnavailableError(SnapshotError):
    """The local daemon could not provide a snapshot at the offsets asked for; ``code`` says why (beyond_end,
    below_log_start, compacted, rebuilding, timeout, no_daemon, ...). Ask for other offsets, wait and retry, or
    read the newest snapshot instead."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class ExecutorConfigError(GlobaldError):
    """A Spark executor cannot use its host's globald config: the file cannot be read, does not mirror the table,
    or mirrors another topic under that name. The message names the host and the file. Point ``GLOBALD_CONFIG`` in
    the executors' environment at this host's config (see docs/spark/index.md), with the same tables as the
    driver's."""
