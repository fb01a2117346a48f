"""`RestateEventLog`: a session's event stream in its virtual object's state.

Each `append` is one state write, a journal entry of the run's invocation: a replay never writes
it again and a crash loses none of a completed step, so the stream holds every durable event
exactly once. A shared handler reads it while the run goes on (`read_events`); the oldest
batches go once the stream passes its retention. Live events (model text, a tool call started)
are not state: `live` hands them, with the durable position they follow, to a `LiveSink` (the
worker's, which passes them on to the session's live stream outside the journal).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from restate.serde import BytesSerde

from .. import jsoncodec
from ..messages import JSON
from ..session.events import DEFAULT_RETAIN, Cursor
from .types import RestateObjectContextLike

RAW = BytesSerde()
BATCH_KEY = re.compile(r"tether:events:(\d{12}):(\d+)")
"""A batch of durable events: the first one's number and how many."""

LiveSink = Callable[[str, int, JSON], None]
"""Takes (session, the durable position the event follows, the event), best effort."""


def _batch_key(first: int, count: int) -> str:
    return f"tether:events:{first:012d}:{count}"


def _batches(keys: Sequence[str]) -> list[tuple[int, int, str]]:
    found = []
    for key in keys:
        match = BATCH_KEY.fullmatch(key)
        if match:
            found.append((int(match[1]), int(match[2]), key))
    return sorted(found)


class RestateEventLog:
    """An `EventLog` over the bound object's state (the object key is the session)."""

    def __init__(
        self,
        ctx: RestateObjectContextLike,
        *,
        sink: LiveSink | None = None,
        retain: int = DEFAULT_RETAIN,
    ) -> None:
        self._ctx = ctx
        self.sink = sink
        self.retain = retain
        self._batches: list[tuple[int, int, str]] | None = None

    async def _known(self) -> list[tuple[int, int, str]]:
        if self._batches is None:  # once per invocation: a journaled read of the keys
            self._batches = _batches(await self._ctx.state_keys())
        return self._batches

    @property
    def position(self) -> int:
        """The number of the last durable event written (0 before the first)."""
        if not self._batches:
            return 0
        first, count, _ = self._batches[-1]
        return first + count - 1

    async def append(self, session_id: str, events: Sequence[JSON]) -> None:
        batches = await self._known()
        first = self.position + 1
        numbered = [{**e, "id": str(first + i)} for i, e in enumerate(events)]
        key = _batch_key(first, len(numbered))
        self._ctx.set(key, jsoncodec.dumps(numbered), serde=RAW)
        batches.append((first, len(numbered), key))
        kept = sum(count for _, count, _ in batches)
        while len(batches) > 1 and kept - batches[0][1] >= self.retain:
            kept -= batches[0][1]
            self._ctx.clear(batches.pop(0)[2])

    def live(self, session_id: str, event: JSON) -> None:
        if self.sink is not None and self._batches is not None:
            self.sink(session_id, self.position, event)


async def read_events(ctx: Any, after: Cursor, limit: int = 1000) -> list[JSON]:
    """The durable events after `after` (at most `limit`), for a shared handler."""
    events: list[JSON] = []
    for first, count, key in _batches(await ctx.state_keys()):
        if first + count - 1 <= after.durable:
            continue
        data = await ctx.get(key, serde=RAW)
        if data is None:  # cleared since the keys were listed
            continue
        events += [e for e in jsoncodec.loads(data) if int(e["id"]) > after.durable]
        if len(events) >= limit:
            break
    return events[:limit]
