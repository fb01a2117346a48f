"""`RestateEventLog`: a session's event stream in its virtual object's state.

Each `append` is one state write (two when it seals a segment), a journal entry of the run's
invocation: a replay never writes it again and a crash loses none of a completed step, so the
stream holds every durable event exactly once. The events are a `Chain` (`tether.restate.chain`):
a run reads only its tail to number what it appends, and a reader reads back from the tail as
far as its cursor (a shared handler, `read_events`, while the run goes on). The oldest segments
go once the stream passes its retention. Live events (model text, a tool call started) are not
state: `live` hands them, with the durable position they follow, to a `LiveSink` (the worker's,
which passes them on to the session's live stream outside the journal).

Streams an older version wrote are read as they are, and moved to the chain by the next append:
a chain whose segments count up (`tether:events-`), or a key per batch
(`tether:events:<first>:<count>`, found by listing the state's keys).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from .. import jsoncodec
from ..messages import JSON
from ..session.events import DEFAULT_RETAIN, Cursor
from .chain import PER_SEGMENT, Chain, Values, tail_only
from .keys import EVENTS
from .types import RestateObjectContextLike

COUNTING_UP = "tether:events-"
OLDER_BATCH_KEY = re.compile(r"tether:events:(\d{12}):(\d+)")
"""A batch of durable events as an older version kept it: the first one's number and how many."""
CATCH_UP = 4 * PER_SEGMENT
"""How far behind a reader reads back segment by segment; further, it asks for all at once."""

LiveSink = Callable[[str, int, JSON], None]
"""Takes (session, the durable position the event follows, the event), best effort."""


def _older_batches(keys: Sequence[str]) -> list[tuple[int, str]]:
    return sorted((int(m[1]), key) for key in keys if (m := OLDER_BATCH_KEY.fullmatch(key)))


def _chain(values: Values, retain: int | None = None) -> Chain:
    keep = None if retain is None else max(1, -(-retain // PER_SEGMENT))
    return Chain(values, EVENTS, keep_segments=keep)


class RestateEventLog:
    """An `EventLog` over the bound object's state (the object key is the session). Keeps about
    `retain` events: whole segments of up to `PER_SEGMENT`, fewer when events are large. Its tail
    is in the head (`chain.Values`), read with the session's meta and tails."""

    def __init__(
        self,
        ctx: RestateObjectContextLike,
        *,
        sink: LiveSink | None = None,
        retain: int = DEFAULT_RETAIN,
        values: Values | None = None,
    ) -> None:
        self._ctx = ctx
        self.sink = sink
        self.retain = retain
        self._values = values or Values(ctx)
        self._chain = _chain(self._values, retain)

    async def _known(self) -> Chain:
        # once per invocation: the tail, a journaled read
        if not self._chain.known and await self._chain.read(tail_only) is None:
            await self._move_older()
        return self._chain

    async def _move_older(self) -> None:
        """No tail: a new stream, or one an older version kept (`_read_older`), which moves to
        the chain."""
        keys = await self._values.stored_keys()  # listed already in an object without a head
        events = await _read_older(self._ctx, self._values, keys, Cursor(0))
        self._chain.start_empty()
        if events:
            self._chain.write_all(events, first=int(events[0]["id"]) - 1)
            for key in keys:
                if key.startswith(COUNTING_UP) or OLDER_BATCH_KEY.fullmatch(key):
                    self._values.drop(key)

    @property
    def position(self) -> int:
        """The number of the last durable event written (0 before the first)."""
        return self._chain.count if self._chain.known else 0

    async def append(self, session_id: str, events: Sequence[JSON]) -> None:
        chain = self._chain if self._chain.known else await self._known()
        first = chain.count + 1
        chain.append([{**e, "id": str(first + i)} for i, e in enumerate(events)])

    @property
    def live_wanted(self) -> bool:
        return self.sink is not None

    def live(self, session_id: str, event: JSON) -> None:
        if self.sink is not None and self._chain.known:
            self.sink(session_id, self.position, event)


async def read_events(ctx: Any, after: Cursor, limit: int = 1000) -> list[JSON]:
    """The durable events after `after` (at most `limit`), for a shared handler."""
    values = Values(ctx)
    chain = _chain(values)
    tail = await values.get(chain.tail_key)
    read = await chain.read_from(tail, tail_only)
    if read is None:
        keys = await values.stored_keys()
        return (await _read_older(ctx, values, keys, after, limit))[:limit]
    events, first, _ = read
    if after.durable < first:  # back from the tail: segment by segment, or all at once

        def back_to_cursor(newest: list[JSON]) -> bool:
            return chain.count - len(newest) <= after.durable

        close = first - after.durable <= CATCH_UP
        read = await chain.read_from(tail, back_to_cursor if close else None)
        assert read is not None
        events = read[0]
    return [e for e in events if int(e["id"]) > after.durable][:limit]


async def _read_older(
    ctx: Any, values: Values, keys: Sequence[str], after: Cursor, limit: int | None = None
) -> list[JSON]:
    """The events after `after` of a stream an older version kept (`keys`: the state's)."""
    counting_up = Chain(values, COUNTING_UP, counting_up=True)
    # the keys are listed already: a new stream reads nothing more
    older = await counting_up.read() if counting_up.tail_key in keys else None
    if older is not None:
        return [e for e in older[0] if int(e["id"]) > after.durable]
    events: list[JSON] = []
    for number, key in _older_batches(keys):
        count = int(key.rsplit(":", 1)[1])
        if number + count - 1 <= after.durable:
            continue
        data = await values.get(key)
        if data is None:  # cleared since the keys were listed
            continue
        events += [e for e in jsoncodec.loads(data) if int(e["id"]) > after.durable]
        if limit is not None and len(events) >= limit:
            break
    return events
