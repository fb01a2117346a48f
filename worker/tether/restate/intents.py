"""What this process saw of the attempts that journaled an intent and ended before its bodies.

After a replayed intent, a body with no journaled result either ran in an attempt that died
(a worker crash; or a restate-server crash, which can also lose the body's own command, so its
absence proves nothing) or never started (the attempt ended while it awaited the intent's
acknowledgement: a suspension, a dropped connection). The journal cannot tell these apart. The
process that ran the attempt can: it records the second case under the intent's nonce, and a
later attempt it serves runs the bodies. Without that record (another replica, a restarted
worker, an evicted entry) the bodies are reported interrupted: a false "interrupted" is safe,
a second run of a side effect is not.

The later attempt may come while the earlier one still awaits: a partition's leader moved
between Restate nodes, and the new leader's attempt arrived before the old leader's stream was
torn down here (seen on a 3-node cluster). It then waits for the earlier attempt to settle,
for `HANDOFF_WAIT` at most (a stream to a node that died may linger until TCP gives up).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict

HANDOFF_WAIT = 10.0
"""Seconds a later attempt waits for an earlier one of this process that still awaits the
acknowledgement of the same intent."""


class UnstartedBodies:
    """The nonces of intents whose bodies never started, and of those whose acknowledgement an
    attempt of this process awaits. Bounded: an entry whose invocation never comes back is
    evicted, which costs nothing but a false "interrupted" if it does."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._nonces: OrderedDict[str, None] = OrderedDict()
        self._awaiting: dict[str, asyncio.Future[None]] = {}
        self._capacity = capacity

    def awaiting(self, nonce: str) -> None:
        """An attempt journals the intent `nonce` and awaits its acknowledgement."""
        self._awaiting[nonce] = asyncio.get_running_loop().create_future()
        while len(self._awaiting) > self._capacity:  # an attempt that never settled
            del self._awaiting[next(iter(self._awaiting))]

    def settle(self, nonce: str, *, unstarted: bool) -> None:
        """The attempt awaiting `nonce` goes on to its bodies, or (`unstarted`) ended before
        any started."""
        if unstarted:
            self._nonces[nonce] = None
            while len(self._nonces) > self._capacity:
                self._nonces.popitem(last=False)
        settled = self._awaiting.pop(nonce, None)
        if settled is not None and not settled.done():
            settled.set_result(None)

    async def take(self, nonce: str | None, wait: float = HANDOFF_WAIT) -> bool:
        """Whether `nonce` was recorded, forgetting it: once a body may start, no later
        attempt may trust the record again. An attempt of this process still awaiting its
        acknowledgement is waited for (`wait` seconds at most)."""
        if nonce is None:
            return False
        settled = self._awaiting.get(nonce)
        if settled is not None and settled.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(settled), wait)
        return self._nonces.pop(nonce, False) is None


UNSTARTED_BODIES = UnstartedBodies()
"""The process's record, shared by every invocation it serves."""
