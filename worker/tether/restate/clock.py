"""Replay-stable ids and clock reads for the Restate runtime."""

from __future__ import annotations

from .types import RestateContextLike

DEFAULT_REANCHOR_EVERY = 8


class CoalescedClock:
    """`now()` that journals a real `ctx.time()` anchor every `reanchor_every` reads and derives
    a strictly increasing sequence in between (anchor + 1 ms per read). Timestamps inside a
    window are logical, not wall-accurate; the number and order of journaled reads depend only
    on the number of `now()` calls, never on wall time."""

    def __init__(self, ctx: RestateContextLike, reanchor_every: int | None) -> None:
        self._ctx = ctx
        self._every = reanchor_every
        self._anchor = 0.0
        self._reads = 0
        self._last = 0.0

    async def now(self) -> float:
        if self._every is None or self._reads % self._every == 0:
            self._anchor = await self._ctx.time() * 1000
            offset = 0.0
        else:
            offset = float(self._reads % self._every)
        self._reads += 1
        # Never go backwards, even when a fresh anchor is earlier than a derived value.
        self._last = max(self._anchor + offset, self._last + (1.0 if self._reads > 1 else 0.0))
        return self._last
