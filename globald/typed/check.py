"""``python -m globald.typed.check --config F``: what ``globald run`` checks of the typed tables before it starts.

Every schema file read and mapped to its column type, as ``check-config`` does; a bad one is one line on stderr
naming the key and the file, exit 2, and the daemon does not start. A process of its own because decoding
libraries (pyarrow, fastavro) would otherwise stay loaded in the daemon, which never decodes (``ops.decoding``).
Sections whose reader schema is a registry subject are left to the daemon, which starts when the registry is down.
"""

from __future__ import annotations

import argparse
import sys

from globald.common import exitcodes
from globald.common.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m globald.typed.check", description=__doc__)
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    from globald.settings.config import load
    from globald.typed import check_schemas

    try:
        check_schemas(load(args.config), without_subjects=True)
    except ConfigError as e:
        print(f"globald: config error: {e}", file=sys.stderr)
        return exitcodes.USAGE
    return exitcodes.OK


if __name__ == "__main__":
    sys.exit(main())
