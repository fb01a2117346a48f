"""Replay-stable ids and clock reads for the Restate runtime."""

from __future__ import annotations

import time

from restate import RunOptions
from restate.serde import JsonSerde

from .types import RestateContextLike

DEFAULT_REANCHOR_EVERY = 8

_TIME_OPTIONS: RunOptions[float] = RunOptions(serde=JsonSerde[float]())


async def _wall_seconds() -> float:
    return time.time()


async def journaled_time(ctx: RestateContextLike) -> float:
    """`ctx.time()`, the same journal entry (`timestamp`), without a thread: the SDK runs its
    synchronous action in the event loop's default executor, which tools that block threads
    (`asyncio.to_thread`, held across a crash) can fill, and then every run of the worker waits
    at its next clock read."""
    return float(await ctx.run_typed("timestamp", _wall_seconds, _TIME_OPTIONS))


async def journaled_ms(ctx: RestateContextLike) -> float:
    """`journaled_time` in milliseconds, the unit of the stores' timestamps."""
    return await journaled_time(ctx) * 1000


class CoalescedClock:
    """`now()` that journals a real clock anchor (`journaled_time`) every `reanchor_every`
    reads (None: every read) and derives a strictly increasing sequence in between (anchor + 1
    ms per read). Reads before the invocation's first step share its first journaled read: a
    new session's creation and its run's start are one instant, not two round trips. Timestamps
    inside a window are logical, not wall-accurate; the number and order of journaled reads
    depend only on the `now()` calls and the steps, never on wall time."""

    def __init__(self, ctx: RestateContextLike, reanchor_every: int | None) -> None:
        self._ctx = ctx
        self._every = reanchor_every
        self._anchor = 0.0
        self._reads = 0
        self._last = 0.0
        self._stepped = False

    def step_started(self) -> None:
        self._stepped = True

    async def now(self) -> float:
        every = self._every
        if self._reads == 0 or (self._stepped and (every is None or self._reads % every == 0)):
            self._anchor = await journaled_ms(self._ctx)
            offset = 0.0
        else:
            offset = float(self._reads % every if every else self._reads)
        self._reads += 1
        # Never go backwards, even when a fresh anchor is earlier than a derived value.
        self._last = max(self._anchor + offset, self._last + (1.0 if self._reads > 1 else 0.0))
        return self._last
