"""What an operator may ask a running daemon for (``globald reset``, ``globald export``, ``globald reload``), and the
one request base each part that acts on one settles.

The operator inbox (``ops.operator_requests``) reads a request file, hands an ``OperatorRequest`` to the part that
acts on it (the loop wipes a table, the export service exports one, the reloader applies a config) and answers
the asker with the request's ``reply()`` once it is settled, or with its ``stopped`` text when the daemon stopped
first. Here, below every part, so that the engine, the export service and the reloader each subclass it.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

RESET = "reset"  # `globald reset`: wipe a table's store; the loop restores it from the log start
EXPORT = "export"  # `globald export`: export a table's verified snapshot now ([export] configured)
RELOAD = "reload"  # `globald reload`: read the config file named in the request again (service.reload)
ACTIONS = (RESET, EXPORT, RELOAD)


class OperatorRequest:
    """One operator's request, settled once acted on: ``error`` is None when it was done, else why not; ``answer``
    is what the asker is told besides (an export's id and bytes, a reload's generation). Settled from the thread
    that acts on it, read from any. ``table`` is "" for a request about the whole daemon (a reload)."""

    action: ClassVar[str]
    stopped: ClassVar[str]  # the error the asker gets when the daemon stopped before it acted

    def __init__(self, table: str, detail: str) -> None:
        self.table = table
        self.detail = detail
        self.error: str | None = None
        self.answer: dict[str, Any] = {}
        self._settled = threading.Event()

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    def settle(self, error: str | None, **answer: Any) -> None:
        self.error, self.answer = error, answer
        self._settled.set()  # last: whoever sees it settled reads the final error and answer

    def failure(self) -> str:
        """The error the asker is told, once settled with one."""
        return self.error or ""

    def reply(self) -> dict[str, Any]:
        """What the asker is told once the request is settled."""
        if self.error is None:
            return {**self.answer, "ok": True, "table": self.table}
        return {**self.answer, "ok": False, "table": self.table, "error": self.failure()}
