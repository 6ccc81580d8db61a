"""The real daemon (``globald run``, the command itself), with every line librdkafka logs at DEBUG let through.

``logs.setup`` keeps globald's librdkafka logger at WARNING or above, and its repeated-problem filter logs a
problem once however many clients repeat it, so a test could not see each client the daemon makes. Here that
logger is set to DEBUG after each setup and reload; with ``[kafka] debug = "broker"`` every client then names its
bootstrap brokers, under its own name (``<client.id>#consumer-<n>``), as it starts.

Run as ``python -m tests.support.client_debug run --config FILE`` (``DaemonProcess.module``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from globald.cli.main import main
from globald.common import logs


def _then_debug(fn: Callable[..., None]) -> Callable[..., None]:
    def call(*args: Any, **kwargs: Any) -> None:
        fn(*args, **kwargs)
        logging.getLogger("globald.librdkafka").setLevel(logging.DEBUG)

    return call


logs.setup = _then_debug(logs.setup)
logs.reconfigure = _then_debug(logs.reconfigure)

if __name__ == "__main__":
    sys.exit(main())
