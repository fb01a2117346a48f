"""What this process saw of the attempts that journaled an intent and ended before their bodies'
results were acknowledged.

After a replayed intent, a body with no journaled result either
- never started: the attempt ended while it awaited the intent's acknowledgement (a
  suspension, a dropped connection);
- started in this process, and ran on after its attempt ended: a Restate node was lost or a
  partition's leader moved while the body ran or while its result awaited acknowledgement;
- started in a process that is gone (a worker crash) or on another replica.
(A restate-server crash can also lose a body's own command after the body started, so the
journal's silence proves nothing.) The journal cannot tell these apart; the process that ran
the attempt can. It keeps, under the intent's nonce, whether the bodies never started and every
body it started, shielded from its attempt's end: a later attempt it serves runs bodies that
never started, and journals the result of one that did (awaiting it if it still runs) instead
of running it again. Without a record (another replica, a restarted worker, an evicted record)
the bodies are reported interrupted: a false "interrupted" is safe, a second run of a side
effect is not. Unless a `Handoff` carries the result across processes: the process whose
attempt ended hands over the bodies it started, and a later attempt on another replica asks
for them there.

The later attempt may come while the earlier one still awaits the intent's acknowledgement: a
partition's leader moved between Restate nodes, and the new leader's attempt arrived before the
old leader's stream was torn down here (seen on a 3-node cluster). It then waits for the earlier
attempt to settle, for `HANDOFF_WAIT` at most (a stream to a node that died may linger until
TCP gives up).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

HANDOFF_WAIT = 10.0
"""Seconds a later attempt waits for an earlier one of this process that still awaits the
acknowledgement of the same intent."""

NOT_HERE: Any = object()
"""`Intents.result`: this process started no such body, or it was cancelled unfinished."""


class Handoff(Protocol):
    """Tool bodies' results from the process that ran them to a later attempt of the same
    invocation served by another (a worker replica to another; `tether.programs.worker.handoff`
    through Restate). Both ends are best effort: a result not handed over is reported
    interrupted, as without a handoff."""

    def hand_over(self, nonce: str, bodies: Mapping[str, asyncio.Task[Any]]) -> None:
        """The attempt that started `bodies` (by step name) for the intent `nonce` ended before
        their results were all acknowledged: make each one's result available when it has one
        (meanwhile, that it still runs)."""
        ...

    async def result(self, nonce: str, name: str) -> Any:
        """The result of the body `name` handed over for `nonce`, awaited while its process
        says it runs; `NOT_HERE` if none was (or its process went quiet)."""
        ...


class _Record:
    """One intent's: settled once its attempt got the acknowledgement or ended without it."""

    __slots__ = ("bodies", "settled", "unstarted")

    def __init__(self) -> None:
        self.settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.unstarted = False
        self.bodies: dict[str, asyncio.Task[Any]] = {}


class Intents:
    """The records of this process's intents whose bodies' results are not all acknowledged.
    An attempt that got them all acknowledged forgets its record, so records are only kept for
    attempts that ended early; bounded, the oldest evicted (which costs nothing but a false
    "interrupted" if its invocation comes back)."""

    def __init__(self, capacity: int = 1_000) -> None:
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._capacity = capacity
        self._running: set[asyncio.Task[Any]] = set()
        """Strong references: the event loop keeps only weak ones, and an evicted record's
        body still runs to its end."""

    def journaling(self, nonce: str) -> None:
        """An attempt journals the intent `nonce` (new) and awaits its acknowledgement."""
        self._records[nonce] = _Record()
        while len(self._records) > self._capacity:
            self._records.popitem(last=False)

    def settle(self, nonce: str, *, unstarted: bool) -> None:
        """The attempt awaiting `nonce` goes on to its bodies, or (`unstarted`) ended before
        any started. (Nothing if it journaled no such intent.)"""
        record = self._records.get(nonce)
        if record is None:
            return
        record.unstarted = unstarted
        if not record.settled.done():
            record.settled.set_result(None)

    async def unstarted(self, nonce: str | None, wait: float = HANDOFF_WAIT) -> bool:
        """Whether the attempt of this process that journaled `nonce` ended before any body
        started, forgetting that: once a body may start, no later attempt may trust it again.
        An attempt still awaiting its acknowledgement is waited for (`wait` seconds at most)."""
        record = self._mine(nonce)
        if record is None:
            return False
        if not record.settled.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(record.settled), wait)
        unstarted, record.unstarted = record.unstarted, False
        return unstarted

    def body(
        self, nonce: str | None, name: str, fn: Callable[[], Awaitable[Any]]
    ) -> Callable[[], Awaitable[Any]]:
        """`fn`, started at most once for the intent `nonce` in this process, and run to its
        end even if the attempt that started it ends first (its result is then a later
        attempt's, through `result`)."""

        async def shielded() -> Any:
            record = self._mine(nonce)
            if record is None:  # an intent of before the nonces, or an evicted record
                return await fn()
            task = record.bodies.get(name)
            if task is None:
                task = record.bodies[name] = asyncio.ensure_future(fn())
                self._running.add(task)
                task.add_done_callback(self._running.discard)
            return await asyncio.shield(task)

        return shielded

    async def result(self, nonce: str | None, name: str) -> Any:
        """The result of the body `name` this process started for `nonce`, awaited if it still
        runs; `NOT_HERE` if it started none, or the body was cancelled unfinished."""
        record = self._mine(nonce)
        task = record.bodies.get(name) if record is not None else None
        if task is None:
            return NOT_HERE
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                return NOT_HERE
            raise

    def started(self, nonce: str | None) -> dict[str, asyncio.Task[Any]]:
        """The bodies this process started for `nonce`, by step name (running or not)."""
        record = self._mine(nonce)
        return dict(record.bodies) if record is not None else {}

    def forget(self, nonce: str | None, *, cancel: bool = False) -> None:
        """Every body's result of `nonce` is acknowledged, or (`cancel`) the invocation ends
        without them (cancelled: its bodies are cancelled, as the SDK would have): no later
        attempt needs the record."""
        record = self._records.pop(nonce, None) if nonce is not None else None
        if cancel and record is not None:
            for task in record.bodies.values():
                task.cancel()

    def _mine(self, nonce: str | None) -> _Record | None:
        record = self._records.get(nonce) if nonce is not None else None
        if record is None or record.settled.get_loop() is not asyncio.get_running_loop():
            return None
        return record


INTENTS = Intents()
"""The process's records, shared by every invocation it serves."""
