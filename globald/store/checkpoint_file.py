"""Kafka-format ``.checkpoint`` files (version line ``0``, a count line, then ``topic partition offset`` lines).

They serve tools that must not open the store. A file is replaced durably (``durable.replace_file``), so a reader
sees either the old or the new content, even after a power loss. A file that does not parse is reported, never
trusted.
"""

from __future__ import annotations

from pathlib import Path

from globald.store.durable import replace_file

VERSION = 0


class CheckpointFormatError(ValueError):
    """A .checkpoint file is truncated or not in Kafka's format. globald ignores it and logs this."""


def write(path: Path, offsets: dict[tuple[str, int], int]) -> None:
    lines = [str(VERSION), str(len(offsets))]
    lines += [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    replace_file(path, "\n".join(lines) + "\n")


def read(path: Path) -> dict[tuple[str, int], int]:
    """Offsets in ``path``; {} when it does not exist. Raises CheckpointFormatError when it does not parse."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointFormatError(f"{path}: unreadable: {e}") from None
    lines = text.splitlines()
    try:
        if len(lines) < 2 or int(lines[0]) != VERSION:
            raise CheckpointFormatError(f"{path}: not a version-{VERSION} checkpoint")
        count = int(lines[1])
        entries = lines[2:]
        if count != len(entries):
            raise CheckpointFormatError(f"{path}: says {count} entries, has {len(entries)}")
        offsets: dict[tuple[str, int], int] = {}
        for line in entries:
            topic, partition, offset = line.split(" ")
            if int(offset) < 0 or int(partition) < 0:
                raise CheckpointFormatError(f"{path}: negative number in {line!r}")
            offsets[(topic, int(partition))] = int(offset)
        return offsets
    except ValueError as e:
        if isinstance(e, CheckpointFormatError):
            raise
        raise CheckpointFormatError(f"{path}: malformed: {e}") from None

