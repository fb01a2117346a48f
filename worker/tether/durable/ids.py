"""Replay-stable identifiers."""

from __future__ import annotations

import hashlib

_MASK = (1 << 128) - 1
_KEEP = _MASK & ~(0xF << 76) & ~(0x3 << 62)
"""The bits a v4 UUID takes from the value: all but its version's and its variant's."""
_SET = (0x4 << 76) | (0x2 << 62)
"""Version 4, variant RFC 4122."""
_STRIDE = 0x9E3779B97F4A7C15F39CC0605CEDC835
"""Odd, so counter -> id is one-to-one (modulo 2**128); its bits spread consecutive ids."""


def _uuid_v4_shaped(value: int) -> str:
    """`value` (128 bits) as an RFC-4122 v4 UUID: version and variant bits set, so databases
    and clients treat it as a regular v4; formatted by hand (uuid.UUID is slow on a hot path)."""
    h = "%032x" % ((value & _KEEP) | _SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _hash128(seed: str) -> int:
    return int.from_bytes(hashlib.sha256(seed.encode()).digest()[:16], "big")


def deterministic_uuid(seed: str) -> str:
    """An RFC-4122-v4-shaped UUID derived from `seed`: a pure function, no randomness."""
    return _uuid_v4_shaped(_hash128(seed))


class IdSequence:
    """The ids of `seed`'s counter 1, 2, ...: the same calls in the same order give the same
    ids. The seed is hashed once; each id is that hash plus the counter times an odd stride:
    a sequence never repeats an id, and sequences of different seeds start at unrelated
    points of a 2**122 space."""

    def __init__(self, seed: str) -> None:
        self.seed = seed
        self._base = _hash128(seed)
        self._counter = 0

    def next(self) -> str:
        self._counter += 1
        return _uuid_v4_shaped((self._base + self._counter * _STRIDE) & _MASK)
