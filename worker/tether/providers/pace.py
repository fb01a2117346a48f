"""A model's calls paced to a rate (`tether.rate.Rate`): a provider counts requests per minute
per key, and many runs that call at once, on one worker or many, get 429s back."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from ..rate import Rate


class Pacer(Protocol):
    """Where a model's calls take their slots."""

    async def admit(self) -> float:
        """Take the next slot: how many seconds to wait for it."""
        ...


class LocalPacer:
    """The slots of this process's calls (`tether run`, a worker without Restate's ingress)."""

    def __init__(self, rate: Rate, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self._clock = clock
        self._last_ms = 0.0

    async def admit(self) -> float:
        wait_ms, self._last_ms = self.rate.next_slot(self._last_ms, self._clock() * 1000)
        return wait_ms / 1000
