"""The process-wide count of writes RocksDB held back (``writes.write`` counts them; a bulk load's log and the
operators' metrics read them). Per process, like ``globald.common.swallowed``: one daemon runs per process.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stalls:
    """Process-wide count of writes RocksDB held back (for the logs of a load and for operators)."""

    waited: int = 0  # writes that waited for room
    remade: int = 0  # batches made again after RocksDB refused them
    seconds: float = 0.0  # total wait


STALLS = Stalls()
