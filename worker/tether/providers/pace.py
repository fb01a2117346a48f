"""A model's calls paced (`tether.rate.Pace`): a provider counts requests and input tokens a
minute per key, and many runs that call at once, on one worker or many, get 429s back."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ..rate import Pace


class Pacer(Protocol):
    """Where a model's calls take their slots."""

    pace: Pace

    async def admit(self, tokens: int) -> float:
        """Take the next slots of a call of `tokens` input tokens: how many seconds to wait."""
        ...


class LocalPacer:
    """The slots of this process's calls (`tether run`, a worker without Restate's ingress)."""

    def __init__(self, pace: Pace, clock: Callable[[], float] = time.monotonic) -> None:
        self.pace = pace
        self._clock = clock
        self._last: dict[str, float] = {}

    async def admit(self, tokens: int) -> float:
        wait_ms, self._last = self.pace.next_slots(self._last, self._clock() * 1000, tokens)
        return wait_ms / 1000
