"""A session's event stream: what its runs do, for the people watching them.

Two kinds of events, one order:
- durable events (a run started or ended, a model call done, a tool call finished, a call
  parked or answered, a child spawned or finished, a budget warning) are appended once per
  journal position: a replay never appends them again, and a crash loses none of a completed
  step. Their ids are `"<n>"`, the position in the session's stream;
- live events (model text as it streams, a tool call started) are best effort, never journaled:
  a crash may cut them off, and a model call that starts again is announced with
  `model_restarted` so a client drops the partial text. Their ids are `"<n>.<m>"`: the session's
  m-th live event, which followed durable event n.

A reader's place is a `Cursor`: the last durable and the last live event it has. Live events
travel apart from durable ones and may come in after a later durable event; the cursor keeps
both counts, so a reader that resumes from it gets each event it has not had, exactly once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from ..messages import JSON

DEFAULT_RETAIN = 10_000
"""Durable events kept per session (the oldest go first)."""
LIVE_KEEP = 500
"""Live events kept per session, for clients that reconnect mid-call."""


class Cursor(NamedTuple):
    """A reader's place: it has every durable event up to `durable` and every live event up to
    the `live`-th. Written `"<durable>.<live>"` (or `"<durable>"`), like an event id."""

    durable: int
    live: int = 0

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        """The cursor written `text` (`"7"`, `"7.3"`); the start for None or nonsense."""
        if not isinstance(text, str) or not text:  # from anyone: anything
            return cls(0)
        durable, _, live = text.partition(".")
        try:
            return cls(max(0, int(durable)), max(0, int(live or 0)))
        except ValueError:
            return cls(0)

    def has(self, event: JSON) -> bool:
        """Whether a reader at this cursor has had `event`."""
        number, live = position(event)
        return live <= self.live if live else number <= self.durable

    def past(self, event: JSON) -> Cursor:
        """The cursor once `event` is had too."""
        number, live = position(event)
        if live:
            return Cursor(self.durable, max(self.live, live))
        return Cursor(max(self.durable, number), self.live)

    def __str__(self) -> str:
        return f"{self.durable}.{self.live}" if self.live else str(self.durable)


def position(event: JSON) -> tuple[int, int]:
    """An event's place in the stream, from its id: (durable number, live number or 0)."""
    cursor = Cursor.parse(str(event["id"]))
    return cursor.durable, cursor.live


@runtime_checkable
class EventLog(Protocol):
    """Where a runtime's runs append their events (`RuntimeStores.events`)."""

    async def append(self, session_id: str, events: Sequence[JSON]) -> None:
        """Append durable events, giving each its id. Called outside any step: a backend
        whose writes are journaled (Restate's state) appends once per journal position."""
        ...

    def live(self, session_id: str, event: JSON) -> None:
        """Pass on a live event, best effort: never blocks, never fails the run."""
        ...

    @property
    def live_wanted(self) -> bool:
        """Whether `live` passes events on at all: runs build none when it does not."""
        ...


@dataclass
class _Stream:
    durable: deque[JSON] = field(default_factory=deque)
    live: deque[JSON] = field(default_factory=lambda: deque(maxlen=LIVE_KEEP))
    last: int = 0
    live_count: int = 0
    """Live events numbered so far in the session (never reset)."""
    _changed: asyncio.Event | None = None
    """Set (and dropped) at each new event: followers wait on the one they saw. Made only when
    one is asked for: most streams have no follower, and every step notifies."""

    def changed(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


class MemoryEventLog:
    """The event streams of an in-process runtime (memory or SQLite): `follow` them with
    `async for`. A run resumed in a new process from its SQLite journal appends the events of
    its replayed steps again, into this process's fresh log."""

    live_wanted = True
    """Live events are kept for followers, who may come later."""

    def __init__(self, retain: int = DEFAULT_RETAIN) -> None:
        self.retain = retain
        self._streams: dict[str, _Stream] = {}

    def _stream(self, session_id: str) -> _Stream:
        stream = self._streams.get(session_id)
        if stream is None:
            stream = self._streams[session_id] = _Stream()
        return stream

    async def append(self, session_id: str, events: Sequence[JSON]) -> None:
        stream = self._stream(session_id)
        for event in events:
            stream.last += 1
            stream.durable.append({**event, "id": str(stream.last)})
        while len(stream.durable) > self.retain:
            stream.durable.popleft()
        stream.notify()

    def live(self, session_id: str, event: JSON) -> None:
        stream = self._stream(session_id)
        stream.live_count += 1
        stream.live.append({**event, "id": str(Cursor(stream.last, stream.live_count))})
        stream.notify()

    def read(self, session_id: str, after: Cursor | None = None) -> list[JSON]:
        """The events kept that a reader at `after` has not had, in stream order."""
        stream = self._stream(session_id)
        return unseen(after or Cursor(0), [*stream.durable, *stream.live])

    async def follow(self, session_id: str, after: str | None = None) -> AsyncIterator[JSON]:
        """Every event a reader at the cursor `after` has not had (all kept, by default), then
        each new one as it comes, each with the reader's `cursor` after it (what to resume
        from); runs until the caller stops iterating."""
        stream = self._stream(session_id)
        cursor = Cursor.parse(after)
        while True:
            changed = stream.changed()
            events = self.read(session_id, cursor)
            if not events:
                await changed.wait()
                continue
            for event in events:
                cursor = cursor.past(event)
                yield {**event, "cursor": str(cursor)}


def unseen(cursor: Cursor, events: Sequence[JSON]) -> list[JSON]:
    """The events a reader at `cursor` has not had, in stream order."""
    return sorted((e for e in events if not cursor.has(e)), key=position)


def event(kind: str, run: str, at: float, **fields: Any) -> JSON:
    """One event: its type, the run it belongs to, when (epoch ms, journaled), and fields."""
    return {"type": kind, "run": run, "at": at, **fields}
