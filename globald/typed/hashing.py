"""The columnar file's key index: a 64-bit hash of each key computed over the Arrow buffers at once, and the
open-addressing table of those hashes stored in the file (``columnar``). ``HASH`` names the function in each file's
metadata; a file hashed by another is rebuilt.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HASH = "poly-fnv-fmix64-v1"  # key_hashes; part of the file's metadata, a file of another is rebuilt
_P = np.uint64(0x100000001B3)  # FNV-1's 64-bit prime: odd, so every power is, and no byte's weight vanishes
_LEN = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_powers = np.ones(1, np.uint64)


def as_binary(keys: pa.Array) -> pa.Array:
    """String keys as their UTF-8 bytes (a view, no copy); binary keys as they are."""
    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        return keys.cast(pa.large_binary() if pa.types.is_large_string(keys.type) else pa.binary())
    return keys


def _power_table(n: int) -> np.ndarray:
    """P**k mod 2**64 for k < n, grown once and kept."""
    global _powers
    if len(_powers) < n:
        with np.errstate(over="ignore"):
            _powers = np.cumprod(np.concatenate(([np.uint64(1)], np.full(n - 1, _P, np.uint64))), dtype=np.uint64)
    return _powers


def key_hashes(keys: pa.Array) -> np.ndarray:
    """A 64-bit hash of each key's bytes, computed over the Arrow buffers at once: the key's bytes as a polynomial
    in P (mod 2**64) plus its length, through MurmurHash3's finalizer so that the low bits that pick a slot mix
    every byte. Not a defence against chosen keys (those only lengthen probes: every hit is confirmed byte for
    byte); ~20 ns a key, where hashing Python bytes objects costs ~0.7 us."""
    keys = as_binary(keys)
    n = len(keys)
    if not n:
        return np.empty(0, np.uint64)
    if keys.null_count:  # a null's offsets may still span bytes: hash it as empty (it is never looked up)
        keys = pc.if_else(keys.is_valid(), keys, pa.scalar(b"", keys.type))
    buffers = keys.buffers()
    width = np.int64 if pa.types.is_large_binary(keys.type) else np.int32
    offsets = np.frombuffer(buffers[1], width)[keys.offset:keys.offset + n + 1].astype(np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    lengths = np.diff(offsets)
    data = (np.frombuffer(buffers[2], np.uint8)[lo:hi] if buffers[2] is not None else np.empty(0, np.uint8))
    longest = int(lengths.max(initial=0))
    powers = _power_table(longest + 1)
    with np.errstate(over="ignore"):
        if longest and (lengths == longest).all():  # keys of one length (ids, UUIDs): a matrix, fewer passes
            h = (data.reshape(n, longest).astype(np.uint64) * powers[longest - 1::-1]).sum(axis=1, dtype=np.uint64)
        else:
            from_end = np.repeat(offsets[1:], lengths) - np.arange(lo, hi) - 1  # each byte's place from its end
            weighted = data.astype(np.uint64) * powers[from_end]
            sums = np.concatenate((np.zeros(1, np.uint64), np.cumsum(weighted, dtype=np.uint64)))
            h = sums[offsets[1:] - lo] - sums[offsets[:-1] - lo]
        h += lengths.astype(np.uint64) * _LEN
        h ^= h >> np.uint64(33)
        h *= _M1
        h ^= h >> np.uint64(33)
        h *= _M2
        h ^= h >> np.uint64(33)
    return h


def slot_table(hashes: np.ndarray) -> tuple[np.ndarray, int]:
    """(slots, longest probe) of an open-addressing table with linear probing of ``hashes``: twice their number of
    slots, each a row or -1. Built for all rows at once, one probe step per round."""
    size = np.uint64(max(2 * len(hashes), 1))
    slots = np.full(2 * len(hashes), -1, np.int32 if len(hashes) < 2**31 else np.int64)
    pending = np.arange(len(hashes), dtype=np.int64)
    step = 0
    while len(pending):
        at = ((hashes[pending] + np.uint64(step)) % size).astype(np.int64)
        free = np.less(slots[at], 0)
        # Of several rows reaching one free slot in a round, the first takes it; the others probe on.
        cand_at, cand = at[free], pending[free]
        first_at, first = np.unique(cand_at, return_index=True)
        slots[first_at] = cand[first]
        placed = np.zeros(len(pending), bool)
        placed[np.flatnonzero(free)[first]] = True
        pending = pending[~placed]
        step += 1
    return slots, step
