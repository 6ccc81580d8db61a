"""The reload tests' background samplers (tests/integration/test_reload.py ``Background``) prove nothing if they die
or never sample: both must fail the test (issue 40 item 5.4)."""

from __future__ import annotations

import time

import pytest

from tests.integration.test_reload import Background


class Dies(Background):
    every = 0.01

    def step(self) -> None:
        if self.steps == 2:
            raise KeyError("tables")


class Counts(Background):
    every = 0.01

    def step(self) -> None:
        pass


def test_a_sampler_that_dies_fails_the_block_with_its_error() -> None:
    with pytest.raises(AssertionError, match="Dies died after 2 steps") as e, Dies() as d:
        while d.error is None:
            time.sleep(0.01)
    assert isinstance(e.value.__cause__, KeyError)


def test_a_sampler_that_made_too_few_steps_fails_the_block() -> None:
    watch = Counts()
    watch.min_steps = 10**9
    with pytest.raises(AssertionError, match="fewer than"), watch:
        pass


def test_a_sampler_that_sampled_passes() -> None:
    with Counts() as c:
        while c.steps < 3:
            time.sleep(0.01)
