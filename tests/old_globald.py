"""``python -m tests.old_globald``: the globald CLI as the release before format 2, which reads format 1 only.

Used by downgrade tests. It is this build with its readable formats cut back to format 1 before any store code is
imported; a store it cannot read then takes the same path an older release takes: wipe, log, rebuild, keep running.
"""

from __future__ import annotations

import sys

from globald.store import names

names.FORMAT_VERSION = names.FORMAT_TIMESTAMPED
names.READABLE_FORMATS = (names.FORMAT_TIMESTAMPED,)

from globald.cli.main import main  # noqa: E402 - must come after the constants are cut back

if __name__ == "__main__":
    sys.exit(main())
