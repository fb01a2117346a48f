"""What this process saw of the attempts that journaled an intent and ended before its bodies.

After a replayed intent, a body with no journaled result either ran in an attempt that died
(a worker crash; or a restate-server crash, which can also lose the body's own command, so its
absence proves nothing) or never started (the attempt ended while it awaited the intent's
acknowledgement: a suspension, a dropped connection). The journal cannot tell these apart. The
process that ran the attempt can: it records the second case under the intent's nonce, and a
later attempt it serves runs the bodies. Without that record (another replica, a restarted
worker, an evicted entry) the bodies are reported interrupted: a false "interrupted" is safe,
a second run of a side effect is not.
"""

from __future__ import annotations

from collections import OrderedDict


class UnstartedBodies:
    """The nonces of intents whose bodies never started. Bounded: an entry whose invocation
    never comes back is evicted, which costs nothing but a false "interrupted" if it does."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._nonces: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def record(self, nonce: str) -> None:
        self._nonces[nonce] = None
        while len(self._nonces) > self._capacity:
            self._nonces.popitem(last=False)

    def take(self, nonce: str | None) -> bool:
        """Whether `nonce` was recorded, forgetting it: once a body may start, no later
        attempt may trust the record again."""
        return nonce is not None and self._nonces.pop(nonce, False) is None


UNSTARTED_BODIES = UnstartedBodies()
"""The process's record, shared by every invocation it serves."""
