"""Values read from an agent's Restate state (its schedules, its spend), as shown in the status.
Only the agent's signed handlers write that state, but anyone who reaches Restate's admin API can
rewrite it by hand: a value of the wrong type reads as missing instead of failing the status pass
of every agent."""

from __future__ import annotations

import math
from typing import Any


def number_in(found: Any, key: str) -> float | None:
    """`found[key]` where `found` is an object and that is a finite number (not a bool)."""
    value = found.get(key) if isinstance(found, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def text_in(found: Any, key: str) -> str | None:
    """`found[key]` where `found` is an object and that is a string."""
    value = found.get(key) if isinstance(found, dict) else None
    return value if isinstance(value, str) else None
