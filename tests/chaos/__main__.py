"""``python -m tests.chaos``: the randomized fault campaign (see tests/chaos/runner.py and campaign.py)."""

import sys

from tests.chaos.runner import main

sys.exit(main())
