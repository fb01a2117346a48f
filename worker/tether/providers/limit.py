"""A cap on a model's calls in flight in this process: a provider's rate limits are per key, and
a worker with many runs would otherwise send every run's call at once and get 429s back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .base import ModelRequest, ModelResponse, Provider, TextCallback


class Limited:
    """`provider` with at most `max_calls` of its calls in flight at once; the others wait their
    turn, in order, inside their model step (a wait is not journaled: it only delays the call,
    and its timeout starts once it is sent). `on_waiting` hears how many calls wait, each time
    that changes (the worker's `tether_model_calls_waiting`)."""

    def __init__(
        self,
        provider: Provider,
        max_calls: int,
        on_waiting: Callable[[int], None] | None = None,
    ) -> None:
        if max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, not {max_calls}")
        self.provider = provider
        self.name = provider.name
        self.model = provider.model
        self.pricing = provider.pricing
        self.context_window = provider.context_window
        self.max_calls = max_calls
        self.on_waiting = on_waiting
        self.waiting = 0
        self._slots = asyncio.Semaphore(max_calls)

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        if self._slots.locked():
            self._count_waiting(+1)
            try:
                await self._slots.acquire()
            finally:  # a run aborted while it waits leaves the queue too
                self._count_waiting(-1)
        else:
            await self._slots.acquire()
        try:
            return await self.provider.complete(request, on_text)
        finally:
            self._slots.release()

    def _count_waiting(self, change: int) -> None:
        self.waiting += change
        if self.on_waiting is not None:
            self.on_waiting(self.waiting)
