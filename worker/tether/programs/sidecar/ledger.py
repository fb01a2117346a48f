"""The awakeable ids this process answered or is answering: a second answer here is refused
(409) without a call to Restate. A cache only, and per process: that a call is answered once
through every replica and restart comes from the idempotency key of the answer in Restate
(`context.Sidecar.answer`)."""

from __future__ import annotations

from collections import OrderedDict

from .rejection import Rejection


class ResolutionLedger:
    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._done: OrderedDict[str, str] = OrderedDict()
        self._in_flight: set[str] = set()

    def require_open(self, awakeable_id: str) -> None:
        """409 if `awakeable_id` is answered or being answered."""
        if awakeable_id in self._done or awakeable_id in self._in_flight:
            how = self._done.get(awakeable_id, "being resolved")
            raise Rejection(409, "already_resolved", f"this call was already answered ({how})")

    def claim(self, awakeable_id: str) -> None:
        """Reserve `awakeable_id` for one resolution (409 if it is taken or done)."""
        self.require_open(awakeable_id)
        self._in_flight.add(awakeable_id)

    def release(self, awakeable_id: str) -> None:
        """The resolution failed: the id may be answered again."""
        self._in_flight.discard(awakeable_id)

    def done(self, awakeable_id: str, how: str) -> None:
        self._in_flight.discard(awakeable_id)
        self._done[awakeable_id] = how
        while len(self._done) > self._capacity:
            self._done.popitem(last=False)

    def __contains__(self, awakeable_id: object) -> bool:
        return awakeable_id in self._done
