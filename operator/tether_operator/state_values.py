"""Values read from an agent's Restate state (its schedules, its spend), as shown in the status.
Only the agent's signed handlers write that state, but anyone who reaches Restate's admin API can
rewrite it by hand: a value of the wrong type reads as missing instead of failing the status pass
of every agent."""

from __future__ import annotations

import math
from typing import Any

LARGEST = 2.0**53
"""Past this no count or time of ours goes (and the status's integers are int64)."""


def number_in(found: Any, key: str) -> float | None:
    """`found[key]` where `found` is an object and that is a number (not a bool) within
    `LARGEST` either side of 0."""
    value = found.get(key) if isinstance(found, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer of 309 digits or more
        return None
    return number if math.isfinite(number) and abs(number) <= LARGEST else None


def text_in(found: Any, key: str) -> str | None:
    """`found[key]` where `found` is an object and that is a string."""
    value = found.get(key) if isinstance(found, dict) else None
    return value if isinstance(value, str) else None
