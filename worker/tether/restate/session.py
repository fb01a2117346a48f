"""`restate_session_store`: a session in the virtual object's state, read from its end.

The turns and the run records are each a `Chain` (`tether.restate.chain`): the newest records in
one value, the rest in sealed segments. Every state read is a journal entry of the run that makes
it, with the value, so a run reads only what it needs: with tail compaction, the turns that cover
the model's context window (and the last user message), and the newest run records; the counts
of what it leaves out are in each chain's tail (`SessionRecord.earlier`). Without compaction the
model gets every turn, so every turn is read (the segments asked for at once).

The meta (`tether:session`: the session's id, creation time, metadata and `layout`) and the
chains' tails are kept in one value, the head (`keys.HEAD`, `chain.Values`), with the events'
tail: a run reads it once, and each checkpoint writes it once. The keys are named for the order
in which Restate sends state with an invocation (shortest first, see `tether.restate.chain`):
the head, then the turns' segments (the newest first), then the events'
(`tether.restate.events`), then the run records' segments, which only their tail's reader
needs.

Sessions that older versions wrote are read as they are and moved to this layout by their next
write: layout 3 (the same chains, named `tether:turns-` and `tether:runs-`, their segments
counting up), layout 2 (records in 64-record segments and a ring of slots, `tether:turns:<k>`,
`tether:turn-slot:<i>`), and no layout (one key `tether:turn:<n>` per turn and
`tether:run:<id>` per run, the run ids in `tether:session`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from .. import jsoncodec
from ..errors import TetherError
from ..session.store import DEFAULT_MAX_VALUE_BYTES, Clock, Enough, every_turn
from ..session.types import Earlier, SessionRecord, SessionRun, SessionTurn
from .chain import Chain, Json, Values, tail_only
from .clock import journaled_ms
from .keys import RUNS, SESSION, TURNS
from .types import RestateObjectContextLike, RestateSessionStoreOptions

META_KEY = SESSION
LAYOUT = 4
COUNTING_UP_LAYOUT = 3
COUNTING_UP = ("tether:turns-", "tether:runs-")
RING_LAYOUT = 2
RING_TURNS = ("tether:turns:", "tether:turn-slot:")
RING_RUNS = ("tether:runs:", "tether:run-slot:")
RING_SIZE = 64
LEGACY_TURN_KEY = re.compile(r"tether:turn:(\d+)(:\d+)?")
OLDER_PREFIXES = ("tether:turn:", "tether:run:", *RING_TURNS, *RING_RUNS, *COUNTING_UP)
"""The keys of the older layouts, cleared when a session moves to this one."""


def _is_assistant(turn: Json) -> bool:
    return bool(turn.get("role") == "assistant")


def _is_child(run: Json) -> bool:
    return run.get("parent_run_id") is not None


class ReadOnlySessionStoreError(TetherError, RuntimeError):
    """A write through a store built for a shared (read-only) handler."""


async def _read_ring(values: Values, keys: tuple[str, str]) -> list[Json]:
    """Layout 2: the 64-record segments up to the first missing one, then the ring slots while
    each holds the record that follows."""
    segment_prefix, slot_prefix = keys
    records: list[Json] = []
    k = 0
    while (segment := await values.get(f"{segment_prefix}{k}")) is not None:
        records += jsoncodec.loads(segment)
        k += 1
    sealed = k * RING_SIZE
    for slot in range(RING_SIZE):
        data = await values.get(f"{slot_prefix}{slot}")
        prefix = b'{"i":%d,"v":' % (sealed + slot)
        if data is None or not data.startswith(prefix):
            break  # empty, or a record of an earlier segment: the tail ends here
        records.append(jsoncodec.loads(data[len(prefix) : -1]))
    return records


class RestateSessionStore:
    """A `SessionStore` over the bound virtual object's K/V state. Single-tenant: the object key
    is the session, so the `session_id` arguments are not used to pick the state. `values`: the
    invocation's reader of the state, shared with its other stores."""

    def __init__(
        self,
        ctx: RestateObjectContextLike,
        *,
        clock: Clock | None = None,
        read_only: bool = False,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        values: Values | None = None,
    ) -> None:
        self._ctx = ctx
        # not a method of the store: the store would hold itself, a cycle left for the collector
        self.clock: Clock | None = clock or functools.partial(journaled_ms, ctx)
        self._read_only = read_only
        self._values = values or Values(ctx, max_value_bytes)
        self._meta: Json | None = None
        self._turns = Chain(self._values, TURNS, mark=_is_assistant)
        self._runs = Chain(self._values, RUNS, mark=_is_child)
        self._run_index: dict[str, int] = {}
        """The position of each run record read or written."""
        self._older: tuple[list[Json], list[Json]] | None = None
        """An older layout's turns and runs, read in full, for the move to this one."""

    def _writable(self) -> None:
        if self._read_only:
            raise ReadOnlySessionStoreError(
                "this session store is read-only (built for a shared handler); write from the "
                "object's exclusive handler"
            )

    async def _read(
        self, enough: Enough | None, tails: Sequence[bytes | None] | None = None
    ) -> tuple[list[Json], list[Json], Earlier]:
        """The turns and run records (the newest, with `enough`), and what they leave out;
        `tails`: the values of their tails, when read already."""
        assert self._meta is not None
        if self._meta.get("layout") != LAYOUT:
            turns, runs = await self._read_older()
            self._older = (turns, runs)
            self._run_index = {run["id"]: i for i, run in enumerate(runs)}
            return turns, runs, Earlier()
        if tails is None:
            tails = await self._values.get_many([self._turns.tail_key, self._runs.tail_key])
        # every turn is read all at once, not back from the tail batch by batch
        turns_enough = None if enough is every_turn else enough
        read_turns = await self._turns.read_from(tails[0], turns_enough)
        read_runs = await self._runs.read_from(tails[1], tail_only if enough else None)
        if read_turns is None or read_runs is None:
            raise KeyError("the session's state has no tail of its turns or runs")
        turns, first_turn, assistants = read_turns
        runs, first_run, children = read_runs
        self._run_index = {run["id"]: first_run + i for i, run in enumerate(runs)}
        return turns, runs, Earlier(first_turn, assistants, first_run, children)

    async def _read_older(self) -> tuple[list[Json], list[Json]]:
        assert self._meta is not None
        if self._meta.get("layout") == COUNTING_UP_LAYOUT:
            read = [await Chain(self._values, p, counting_up=True).read() for p in COUNTING_UP]
            turns, runs = ([] if chain is None else chain[0] for chain in read)
            return turns, runs
        if self._meta.get("layout") == RING_LAYOUT:
            return await _read_ring(self._values, RING_TURNS), await _read_ring(
                self._values, RING_RUNS
            )
        # no layout: one key per turn (counted in the state's keys) and per run (listed)
        keys = await self._values.stored_keys()
        count = sum(1 for key in keys if (m := LEGACY_TURN_KEY.fullmatch(key)) and not m[2])
        wanted = [f"tether:turn:{i}" for i in range(count)]
        wanted += [f"tether:run:{run}" for run in self._meta.get("runs", [])]
        records = []
        for key, item in zip(wanted, await self._values.get_many(wanted), strict=True):
            if item is None:
                raise KeyError(f"{key} is missing from the session's state")
            records.append(jsoncodec.loads(item))
        return records[:count], records[count:]

    @property
    def _settled(self) -> bool:
        """Whether the stored records are known in this layout (`_known` has nothing to do)."""
        return self._meta is not None and self._turns.known and self._older is None

    async def _known(self) -> None:
        """Know the stored records before writing: read them if no load did, and move an older
        session's to this layout."""
        meta = await self._loaded_meta()
        if not self._turns.known and self._older is None:
            await self._read(tail_only)
        if self._older is None:
            return
        turns, runs = self._older
        self._older = None
        for key in await self._values.stored_keys():
            if key.startswith(OLDER_PREFIXES):
                self._values.drop(key)
        self._turns.write_all(turns)
        self._runs.write_all(runs)
        meta.pop("runs", None)
        meta["layout"] = LAYOUT
        self._values.put(META_KEY, jsoncodec.dumps(meta))

    async def _loaded_meta(self) -> Json:
        if self._meta is None:
            self._meta = await self._get_meta()
        if self._meta is None:
            raise KeyError("no session in this object yet: create_session() first")
        return self._meta

    async def _get_meta(self) -> Json | None:
        data = await self._values.get(META_KEY)
        return None if data is None else jsoncodec.loads(data)

    # SessionStore -------------------------------------------------------------------------

    async def load(self, session_id: str, enough: Enough | None = None) -> SessionRecord | None:
        # the meta and both tails at once: one round trip with lazy state
        data, *tails = await self._values.get_many(
            [META_KEY, self._turns.tail_key, self._runs.tail_key]
        )
        if data is None:
            return None
        meta = self._meta = jsoncodec.loads(data)
        turns, runs, earlier = await self._read(enough, tails)
        return SessionRecord(
            id=meta["id"],
            created_at=meta["created_at"],
            metadata=meta["metadata"],
            turns=[SessionTurn.from_json(turn) for turn in turns],
            runs=[SessionRun.from_json(run) for run in runs],
            earlier=earlier,
        )

    async def create(self, record: SessionRecord) -> None:
        self._writable()
        if self._meta is None:
            self._meta = await self._get_meta()
        if self._meta is None:
            self._meta = {
                "id": record.id,
                "created_at": record.created_at,
                "metadata": record.metadata,
                "layout": LAYOUT,
            }
            self._values.put(META_KEY, jsoncodec.dumps(self._meta))
            self._turns.write_all([])
            self._runs.write_all([])

    async def write_turns(self, session_id: str, start: int, turns: Sequence[SessionTurn]) -> None:
        self._writable()
        if not self._settled:
            await self._known()
        await self._turns.write(start, [turn.to_json() for turn in turns])

    async def write_run(self, session_id: str, run: SessionRun) -> None:
        self._writable()
        if not self._settled:
            await self._known()
        index = self._run_index.setdefault(run.id, self._runs.count)
        await self._runs.write(index, [run.to_json()])


def restate_session_store(
    ctx: RestateObjectContextLike,
    options: RestateSessionStoreOptions | None = None,
    *,
    clock: Clock | None = None,
    read_only: bool = False,
    values: Values | None = None,
) -> RestateSessionStore:
    """A `SessionStore` backed by the bound virtual object's state. Single-tenant: bind one
    object key per session. `read_only=True` for a shared handler's context (Restate forbids
    writes there): reads work, every write raises. `clock` stamps timestamps replay-stably
    (default: `journaled_ms`; `restate_runtime` passes its own, coalesced, clock)."""
    if options is not None:
        clock, read_only = options.clock, options.read_only
    return RestateSessionStore(ctx, clock=clock, read_only=read_only, values=values)
