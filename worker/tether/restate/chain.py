"""`Chain`: records 0, 1, 2, ... in a virtual object's state, readable from their end.

A session's turns, its run records and its events are each one. The newest records are one value,
the chain's tail (`<prefix>tail`), rewritten with each write; once it holds `PER_SEGMENT` records
or `SEGMENT_BYTES` bytes they are sealed, written once as the next numbered segment
(`<prefix>seg:<k>`), and the tail starts again. The tail also says how many segments there are,
where it starts and how many marked records (a session's assistant turns, its sub-agents' runs)
come before it, so a reader that only needs the newest records reads the tail and as few
segments back as it needs: a run on a 5,000-turn session read every turn, a journal entry each
(Restate journals the value of every state read), to send the model the last few hundred.

Restate sends an object's state with each invocation up to its eager limit, shortest keys first,
then in byte order (measured: `tests/restate/test_long_sessions.py`); what does not fit is read
on demand, a round trip each time. So segments are numbered counting down, in fixed width: the
newest sort first, and a chain's tail is shorter than any segment's key. A chain is named by its
prefix; a shorter prefix sends its segments before a longer one's.

A write is one state write (the tail) plus one per segment it seals; a tail rewrite costs at most
`SEGMENT_BYTES` and a record. The tails of a session's chains are kept in one value with its
meta, the head (`Values`), so a run's checkpoint writes them all at once. A value over the
per-value budget (a huge tool result, an image) is split over several keys (`Values`), so it
cannot turn a state write into a poison pill.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from restate.serde import BytesSerde

from .. import jsoncodec
from ..session.store import DEFAULT_MAX_VALUE_BYTES, Enough
from .keys import HEAD
from .types import RestateObjectContextLike

RAW = BytesSerde()
PER_SEGMENT = 16
SEGMENT_BYTES = 16 * 1024
SEGMENT_DIGITS = 9
"""Segment numbers are written as `NEWEST_FIRST - k` in this many digits."""
NEWEST_FIRST = 10**SEGMENT_DIGITS - 1
READ_AHEAD = 4
"""Segments a reader going back from the tail asks for at once, at first; it asks for twice as
many each time it needs more (with lazy state a round trip per batch: a window of n segments
costs about log2(n) of them, and at most twice the segments it needs)."""
PARTS_PREFIX = b'{"__parts__":'
HEAD_PREFIX = b'{"__head__":{'
HEAD_KEY = HEAD[0]
HEAD_KEYS = frozenset(HEAD)

Json = dict[str, Any]


def _array(items: Sequence[bytes]) -> bytes:
    return b"[" + b",".join(items) + b"]"


class Values:
    """The object's state as JSON bytes, a value over `limit` split over several keys. One per
    invocation serves all its readers.

    The head (`keys.HEAD`: the session's meta and its chains' tails, which every run reads and
    each checkpoint writes) is one value under the first of its keys: a run reads it once and
    a checkpoint writes it once, a journal entry each instead of one per key. An object an
    older version wrote keeps them under their own keys: they are read from there (the keys
    listed once, to read only those stored), and move into the head when it is next written.

    Writes may be held (`hold`): kept here, the last value of each key only, until `flush`
    sends them all at once. A run's stores rewrite their tails several times a turn; held, a
    turn costs one state write for the head, and a tail is put together once per flush
    (`later`). Reads see the held writes, and a key found empty is not read again (a new
    session is looked for, then created)."""

    def __init__(self, ctx: RestateObjectContextLike, limit: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        self.ctx = ctx
        self.limit = limit
        self._held: dict[str, bytes | None] | None = None
        """The writes held back, by key (None: cleared); None when writes go out at once."""
        self._later: dict[str, Callable[[], None]] = {}
        """Writes held as the function that makes them, by key, run before the key is sent
        or read."""
        self._absent: set[str] = set()
        """Keys read or written empty: only this invocation writes them, so they still are."""
        self._head: dict[str, bytes | None] | None = None
        """The head's values by key (None: empty), once read."""
        self._head_parts = 0
        """The parts the head is stored in (0: one value): those it no longer needs are cleared."""
        self._head_changed = False
        self._own: dict[str, int] = {}
        """Keys of the head still stored under their own key (an older layout), with the parts
        of their values: cleared when the head is written."""
        self._parts_read: dict[str, int] = {}
        """The parts of each split value read, by key."""
        self._listed: list[str] | None = None

    @property
    def holding(self) -> bool:
        return self._held is not None

    def hold(self) -> None:
        """Hold the writes from now on, until `release`."""
        if self._held is None:
            self._held = {}

    def later(self, key: str, write: Callable[[], None]) -> None:
        """Write `key` by calling `write` (which writes it with `put`) when the held writes go
        out or the key is read, once however often this is called before; at once when writes
        are not held."""
        if key in self._later:  # queued already (every record of a turn queues its tail)
            return
        if self._held is None:
            write()
            return
        self._held.setdefault(HEAD_KEY if key in HEAD_KEYS else key, None)  # its place in the flush
        self._later[key] = write

    def _make(self, keys: Iterable[str] | None = None) -> None:
        if not self._later:
            return
        for key in list(self._later) if keys is None else [k for k in keys if k in self._later]:
            self._later.pop(key)()

    def flush(self) -> None:
        """Send the held writes, in the order their keys were first written."""
        self._make()
        if self._head_changed:
            self._write_head()
        if self._held:
            held, self._held = self._held, {}
            for key, data in held.items():
                if data is None:
                    self.ctx.clear(key)
                else:
                    self.ctx.set(key, data, serde=RAW)

    def release(self, *, send: bool = True) -> None:
        """Stop holding writes; send the held ones (or, with `send=False`, forget them: the
        attempt failed and its retry will write them again)."""
        if send:
            self.flush()
        self._held = None
        self._later.clear()

    def _set(self, key: str, data: bytes | None) -> None:
        if data is None:
            self._absent.add(key)
        else:
            self._absent.discard(key)
        if self._held is not None:
            self._held[key] = data
        elif data is None:
            self.ctx.clear(key)
        else:
            self.ctx.set(key, data, serde=RAW)

    def _set_in_head(self, key: str, data: bytes | None) -> None:
        assert self._head is not None, f"{key} is written before it is read"
        self._head[key] = data
        if self._held is None:
            self._write_head()
            return
        self._held.setdefault(HEAD_KEY, None)  # its place in the flush
        self._head_changed = True

    def _write_head(self) -> None:
        assert self._head is not None
        stored = [b'"%s":%s' % (key.encode(), v) for key, v in self._head.items() if v is not None]
        parts = 0
        if stored:
            value = HEAD_PREFIX + b",".join(stored) + b"}}"
            parts = self.parts(len(value))
            self._put(HEAD_KEY, value, replacing=0)
        else:
            self._set(HEAD_KEY, None)
        self._clear_parts(HEAD_KEY, parts, self._head_parts)
        self._head_parts = parts
        for key, count in self._own.items():
            self._set(key, None)
            self._clear_parts(key, 0, count)
        self._own.clear()
        self._head_changed = False

    def _clear_parts(self, key: str, start: int, end: int) -> None:
        for i in range(start, end):
            self._set(f"{key}:{i}", None)

    async def _read_head(self) -> None:
        """The head, or in an object an older version wrote, its keys one by one."""
        (data,) = await self._read([HEAD_KEY])
        self._head_parts = self._parts_read.get(HEAD_KEY, 0)
        if data is not None and data.startswith(HEAD_PREFIX):
            kept = jsoncodec.loads(data)["__head__"]
            self._head = {key: jsoncodec.dumps(value) for key, value in kept.items()}
        else:  # the meta alone, or nothing: the other keys, if any, under their own
            self._head = {HEAD_KEY: data}
            listed = await self.stored_keys()
            own = [key for key in HEAD[1:] if key in listed]
            for key, value in zip(own, await self._read(own), strict=True):
                self._head[key] = value
                self._own[key] = self._parts_read.get(key, 0)

    async def stored_keys(self) -> list[str]:
        """The object's state keys as this invocation found them: listed once (a journal
        entry), for the keys of older layouts, which it does not write."""
        if self._listed is None:
            self._listed = await self.ctx.state_keys()
        return self._listed

    def parts(self, size: int) -> int:
        """How many keys a value of `size` bytes is split over (0: it is not split)."""
        return -(-size // self.limit) if size > self.limit else 0

    def put(self, key: str, data: bytes, *, replacing: int = 0) -> None:
        """Store `data` under `key` (in the head, for a key of it), split when over budget;
        `replacing`: the size of the value it replaces, whose parts beyond the new ones are
        cleared."""
        if key in HEAD_KEYS:
            self._set_in_head(key, data)
        else:
            self._put(key, data, replacing=replacing)

    def _put(self, key: str, data: bytes, *, replacing: int) -> None:
        parts = self.parts(len(data))
        if not parts:
            self._set(key, data)
        else:
            for i in range(parts):
                self._set(f"{key}:{i}", data[i * self.limit : (i + 1) * self.limit])
            self._set(key, jsoncodec.dumps({"__parts__": parts}))
        self._clear_parts(key, parts, self.parts(replacing))

    def drop(self, key: str, size: int = 0) -> None:
        """Clear `key` and the parts of its value of `size` bytes."""
        if key in HEAD_KEYS:
            self._set_in_head(key, None)
            return
        self._set(key, None)
        self._clear_parts(key, 0, self.parts(size))

    async def get(self, key: str) -> bytes | None:
        return (await self.get_many([key]))[0]

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        """The values of `keys`, asked for all at once: with lazy state, one round trip to
        Restate rather than one per key (and one more for the parts of split values)."""
        if HEAD_KEYS.isdisjoint(keys):
            return await self._read(keys)
        self._make(keys)
        if self._head is None:
            await self._read_head()
        assert self._head is not None
        rest = [key for key in keys if key not in HEAD_KEYS]
        found = dict(zip(rest, await self._read(rest), strict=True)) if rest else {}
        return [found[key] if key in found else self._head.get(key) for key in keys]

    async def _read(self, keys: Sequence[str]) -> list[bytes | None]:
        found = await self._fetch(keys)
        for i, data in enumerate(found):
            if data is not None and data.startswith(PARTS_PREFIX):
                header = jsoncodec.loads(data)
                if isinstance(header, dict) and set(header) == {"__parts__"}:
                    parts = [f"{keys[i]}:{p}" for p in range(header["__parts__"])]
                    self._parts_read[keys[i]] = len(parts)
                    found[i] = b"".join(part or b"" for part in await self._fetch(parts))
        return found

    async def _fetch(self, keys: Sequence[str]) -> list[bytes | None]:
        # every read is asked for before the first is awaited; a held write is the value
        self._make(keys)
        held = self._held or {}
        wanted: list[Awaitable[bytes | None] | None] = [
            None if key in held or key in self._absent else self.ctx.get(key, serde=RAW)
            for key in keys
        ]
        found: list[bytes | None] = []
        for key, w in zip(keys, wanted, strict=True):
            data = held.get(key) if w is None else (await w) or None
            if data is None:
                self._absent.add(key)
            found.append(data)
        return found


def _never(record: Json) -> bool:
    return False


def tail_only(records: list[Json]) -> bool:
    """The `Enough` of a reader that needs only the tail."""
    return True


class Chain:
    """Records 0, 1, 2, ... as a tail and sealed segments (see the module's doc)."""

    def __init__(
        self,
        values: Values,
        prefix: str,
        *,
        mark: Callable[[Json], bool] = _never,
        keep_segments: int | None = None,
        counting_up: bool = False,
    ) -> None:
        self._values = values
        self.tail_key = f"{prefix}tail"
        self._segment_prefix = f"{prefix}seg:"
        self._mark = mark
        self._keep = keep_segments
        """Sealed segments kept (the oldest are cleared), None: all."""
        self._counting_up = counting_up
        """Segments named `seg:0`, `seg:1`, ...: a chain an older version wrote."""
        self.segments = 0
        self.tail_first = 0
        """The number of the tail's first record: how many are sealed."""
        self.tail_marked = 0
        """Marked records among the sealed ones."""
        self._tail: list[bytes] = []
        self._tail_marks: list[bool] = []
        self._tail_bytes = 0
        self._stored_tail = 0
        """The size of the tail value as stored (its parts are cleared when it shrinks)."""
        self._split: dict[str, int] = {}
        """The sizes of the sealed segments that are split over parts, by key (dropping one
        clears its parts)."""
        self.known = False

    @property
    def count(self) -> int:
        return self.tail_first + len(self._tail)

    def segment_key(self, k: int) -> str:
        if self._counting_up:
            return f"{self._segment_prefix}{k}"
        return f"{self._segment_prefix}{NEWEST_FIRST - k:0{SEGMENT_DIGITS}d}"

    def start_empty(self) -> None:
        self.segments = self.tail_first = self.tail_marked = self._stored_tail = 0
        self._set_tail([], [])
        self._split = {}
        self.known = True

    def _set_tail(self, tail: list[bytes], marks: list[bool]) -> None:
        self._tail, self._tail_marks = tail, marks
        self._tail_bytes = sum(map(len, tail))

    async def read(self, enough: Enough | None = None) -> tuple[list[Json], int, int] | None:
        """The newest records: all of them, or (with `enough`) the tail and the segments before
        it, newest first, until `enough` of what is read holds. Returns the records, the number
        of the first one and how many marked records come before it; None when the chain has
        no tail (it was never written)."""
        return await self.read_from(await self._values.get(self.tail_key), enough)

    async def read_from(
        self, tail: bytes | None, enough: Enough | None = None
    ) -> tuple[list[Json], int, int] | None:
        """`read`, given the tail's value (read together with other keys)."""
        if tail is None:
            return None
        head = jsoncodec.loads(tail)
        records: list[Json] = head["v"]
        self.segments, self.tail_first, self.tail_marked = head["n"], head["first"], head["marked"]
        self._split = dict(head.get("split") or {})
        self._set_tail(
            [jsoncodec.dumps(record) for record in records], [self._mark(r) for r in records]
        )
        self._stored_tail = len(tail)
        self.known = True
        k, first, marked = self.segments, self.tail_first, self.tail_marked
        newest_first = [records]
        ahead = READ_AHEAD
        while k > 0 and (enough is None or not enough(records)):
            # every segment at once without `enough`; else a batch twice the last one
            batch = list(range(max(0, k - (ahead if enough else k)), k))
            ahead *= 2
            found = await self._values.get_many([self.segment_key(j) for j in batch])
            for j, segment in zip(reversed(batch), reversed(found), strict=True):
                if segment is None:  # cleared: older records are not kept
                    k = 0
                    break
                k = j
                older: list[Json] = jsoncodec.loads(segment)
                first -= len(older)
                marked -= sum(1 for record in older if self._mark(record))
                if enough is None:
                    newest_first.append(older)
                    continue
                records = older + records
                if enough(records):
                    break
        if enough is None:
            records = [record for chunk in reversed(newest_first) for record in chunk]
        return records, first, marked

    async def write(self, start: int, records: Sequence[Json]) -> None:
        """Store `records` as records `start, start + 1, ...` (replacing what is there)."""
        assert self.known, "read the chain first"
        count = self.count
        if start == count:
            self.append(records)
            return
        if start > count:
            raise ValueError(f"records are written in order: {start} after {count} stored")
        if start < self.tail_first:
            await self._rewrite(start, records)
            return
        offset = start - self.tail_first
        end = offset + len(records)
        self._tail[offset:end] = [jsoncodec.dumps(record) for record in records]
        self._tail_marks[offset:end] = [self._mark(r) for r in records]
        self._tail_bytes = sum(map(len, self._tail))
        self._store()

    def append(self, records: Sequence[Json]) -> None:
        """Store `records` after the last one: `write(count, records)`, the common case, kept
        cheap (it runs for every turn and event, on every replay too)."""
        assert self.known, "read the chain first"
        tail, marks, mark = self._tail, self._tail_marks, self._mark
        size = self._tail_bytes
        for record in records:
            data = jsoncodec.dumps(record)
            tail.append(data)
            marks.append(mark(record))
            size += len(data)
        self._tail_bytes = size
        if len(tail) >= PER_SEGMENT or size >= SEGMENT_BYTES:  # `_store`, inlined
            self._seal()
        self._values.later(self.tail_key, self._put_tail)

    def write_all(self, records: Sequence[Json], first: int = 0) -> None:
        """Store `records` as the whole chain, numbered from `first` (a chain moved from an
        older layout, which kept only its newest records)."""
        self.start_empty()
        self.tail_first = first
        self._set_tail(
            [jsoncodec.dumps(record) for record in records], [self._mark(r) for r in records]
        )
        self._store()

    def _full(self) -> bool:
        return bool(self._tail) and (
            len(self._tail) >= PER_SEGMENT or self._tail_bytes >= SEGMENT_BYTES
        )

    def _seal_next(self, replacing: int = 0) -> None:
        """Seal the tail's oldest records: at most `PER_SEGMENT`, under `SEGMENT_BYTES` (but at
        least one), as the next segment (`replacing`: the size of the segment it replaces)."""
        size, take = 0, 0
        if self._tail_bytes < SEGMENT_BYTES:  # the usual case: full by count, not by size
            take = min(len(self._tail), PER_SEGMENT)
            size = sum(map(len, self._tail[:take]))
        while take < min(len(self._tail), PER_SEGMENT) and (
            take == 0 or size + len(self._tail[take]) < SEGMENT_BYTES
        ):
            size += len(self._tail[take])
            take += 1
        key = self.segment_key(self.segments)
        data = _array(self._tail[:take])
        self._values.put(key, data, replacing=replacing)
        self._split.pop(key, None)
        if self._values.parts(len(data)):
            self._split[key] = len(data)
        self.segments += 1
        self.tail_first += take
        self.tail_marked += sum(self._tail_marks[:take])
        del self._tail[:take], self._tail_marks[:take]
        self._tail_bytes -= size
        if self._keep is not None and self.segments > self._keep:
            old = self.segment_key(self.segments - 1 - self._keep)
            self._values.drop(old, self._split.pop(old, 0))

    def _store(self) -> None:
        """Seal what the tail has over its budget into segments, then write the tail."""
        if self._full():
            self._seal()
        self._write_tail()

    def _seal(self, replacing: Sequence[int] = ()) -> None:
        """Seal the tail's records into segments while it is over its budget; the i-th is
        written over a segment of `replacing[i]` bytes (whose parts may be left)."""
        start = self.segments
        while self._full():
            index = self.segments - start
            self._seal_next(replacing[index] if index < len(replacing) else 0)

    def _write_tail(self) -> None:
        self._values.later(self.tail_key, self._put_tail)

    def _put_tail(self) -> None:
        head = b'{"n":%d,"first":%d,"marked":%d,' % (
            self.segments,
            self.tail_first,
            self.tail_marked,
        )
        if self._split:
            head += b'"split":' + jsoncodec.dumps(self._split) + b","
        value = head + b'"v":' + _array(self._tail) + b"}"
        self._values.put(self.tail_key, value, replacing=self._stored_tail)
        self._stored_tail = len(value)

    async def _rewrite(self, start: int, records: Sequence[Json]) -> None:
        """Replace records in sealed segments: the segments from the one holding `start` are
        read back (newest first) and written again, with the records after them."""
        k, first, marked = self.segments, self.tail_first, self.tail_marked
        stored: list[bytes] = []
        stored_marks: list[bool] = []
        sizes: list[int] = []
        while first > start:
            k -= 1
            segment = await self._values.get(self.segment_key(k))
            if segment is None:
                raise KeyError(f"{self.segment_key(k)} is missing from the state")
            older = jsoncodec.loads(segment)
            older_marks = [self._mark(record) for record in older]
            first -= len(older)
            marked -= sum(older_marks)
            stored = [jsoncodec.dumps(record) for record in older] + stored
            stored_marks = older_marks + stored_marks
            sizes.insert(0, len(segment))
        old_segments = self.segments
        tail = stored + self._tail
        marks = stored_marks + self._tail_marks
        offset = start - first
        replaced = [jsoncodec.dumps(record) for record in records]
        tail[offset : offset + len(replaced)] = replaced
        marks[offset : offset + len(replaced)] = [self._mark(r) for r in records]
        self.segments, self.tail_first, self.tail_marked = k, first, marked
        self._set_tail(tail, marks)
        self._seal(replacing=sizes)
        for gone in range(self.segments, old_segments):  # fewer segments than before
            key = self.segment_key(gone)
            self._values.drop(key, sizes[gone - k])
            self._split.pop(key, None)
        self._write_tail()
