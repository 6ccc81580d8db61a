"""The fingerprint ladder (globald.store.fingerprint): what it keeps as records are applied, and its encoding."""

from __future__ import annotations

import pytest

from globald.store.fingerprint import EMPTY, Fingerprint, Ladder, digest


def fp(offset: int) -> Fingerprint:
    return Fingerprint(offset, digest(b"k%d" % offset, b"v", -1))


def test_digest_tells_null_key_tombstone_and_timestamp_apart() -> None:
    seen = {digest(None, b"v", -1), digest(b"", b"v", -1), digest(b"k", None, -1), digest(b"k", b"", -1),
            digest(b"k", b"v", -1), digest(b"k", b"v", 0), digest(b"kv", b"", -1), digest(b"k", b"v2", -1)}
    assert len(seen) == 8


def test_the_ladder_keeps_the_newest_and_older_rungs_spaced_further_apart() -> None:
    ladder = EMPTY
    for offset in range(0, 2_000_000, 7):
        ladder = ladder.climb(fp(offset))
        offsets = [f.offset for f in ladder.rungs]
        assert offsets[0] == offset
        assert offsets == sorted(offsets, reverse=True) and len(set(offsets)) == len(offsets) <= 4
    offsets = [f.offset for f in ladder.rungs]
    # Each older rung is within its spacing of the next newer one's predecessor, and far behind the newest.
    assert len(offsets) == 4
    assert 0 < offsets[0] - offsets[1] <= 1_000 + 7
    assert 1_000 <= offsets[0] - offsets[2] <= 100_000 + 1_007
    assert offsets[0] - offsets[3] >= 100_000


def test_encoding_round_trips_and_rejects_a_torn_value() -> None:
    ladder = EMPTY.climb(fp(5)).climb(fp(3_000))
    assert Ladder.decode(ladder.encode()) == ladder
    assert Ladder.decode(b"") == EMPTY
    with pytest.raises(ValueError):
        Ladder.decode(ladder.encode()[:-1])


def test_an_unanswered_identity_check_waits_longer_next_time_up_to_a_bound_and_an_answer_resets_it() -> None:
    from globald.kafka.identity import MAX_TIMEOUT_S, next_timeout

    bounds = [2.0]
    for _ in range(6):
        bounds.append(next_timeout(bounds[-1], 2.0, unanswered=True))
    assert bounds == [2.0, 4.0, 8.0, 16.0, MAX_TIMEOUT_S, MAX_TIMEOUT_S, MAX_TIMEOUT_S]
    assert next_timeout(MAX_TIMEOUT_S, 2.0, unanswered=False) == 2.0
