"""Replay-stable identifiers."""

from __future__ import annotations

import hashlib


def deterministic_uuid(seed: str) -> str:
    """An RFC-4122-v4-shaped UUID derived from `seed`: a pure function, no randomness.

    The version and variant bits are set so that databases and clients treat it as a regular v4.
    """
    raw = bytearray(hashlib.sha256(seed.encode()).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()  # formatted by hand: uuid.UUID is slow on a path every step takes
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class IdSequence:
    """Ids hashed from `(seed, counter)`: the same calls in the same order give the same ids."""

    def __init__(self, seed: str) -> None:
        self.seed = seed
        self._counter = 0

    def next(self) -> str:
        self._counter += 1
        return deterministic_uuid(f"{self.seed}:{self._counter}")
