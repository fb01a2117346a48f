"""`restate_session_store`: a session in the virtual object's state, one key per turn.

Never the whole transcript under one key: every state write is a message counted against
Restate's size limit (RT0003), and rewriting a growing array each turn costs O(n^2) bytes. A
value over the per-value budget (a huge tool result, an image) is split over several keys, so
it cannot turn a state write into a poison pill.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from restate.serde import BytesSerde

from .. import jsoncodec
from ..errors import TetherError
from ..session.store import Clock
from ..session.types import SessionRecord, SessionRun, SessionTurn
from .types import RestateObjectContextLike, RestateSessionStoreOptions

META_KEY = "tether:session"
RAW = BytesSerde()
TURN_KEY = re.compile(r"tether:turn:\d+")
DEFAULT_MAX_VALUE_BYTES = 64 * 1024


class ReadOnlySessionStoreError(TetherError, RuntimeError):
    """A write through a store built for a shared (read-only) handler."""


class RestateSessionStore:
    """A `SessionStore` over the bound virtual object's K/V state. Single-tenant: the object key
    is the session, so the `session_id` arguments are not used to pick the state."""

    def __init__(
        self,
        ctx: RestateObjectContextLike,
        *,
        clock: Clock | None = None,
        read_only: bool = False,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self._ctx = ctx
        self.clock: Clock | None = clock or self._context_clock
        self._read_only = read_only
        self._limit = max_value_bytes
        self._meta: dict[str, Any] | None = None

    async def _context_clock(self) -> float:
        return float(await self._ctx.time()) * 1000

    # Values, split when over budget ---------------------------------------------------------

    def _put(self, key: str, value: Any) -> None:
        # Encoded once, stored as the JSON bytes (the SDK's default serde would encode again).
        data = jsoncodec.dumps(value)
        if len(data) <= self._limit:
            self._ctx.set(key, data, serde=RAW)
            return
        parts = [data[i : i + self._limit] for i in range(0, len(data), self._limit)]
        for i, part in enumerate(parts):
            self._ctx.set(f"{key}:{i}", part, serde=RAW)
        self._ctx.set(key, jsoncodec.dumps({"__parts__": len(parts)}), serde=RAW)

    async def _get(self, key: str) -> Any:
        data = await self._ctx.get(key, serde=RAW)
        if not data:
            return None
        value = jsoncodec.loads(data)
        if isinstance(value, dict) and set(value) == {"__parts__"}:
            parts = [
                await self._ctx.get(f"{key}:{i}", serde=RAW) for i in range(value["__parts__"])
            ]
            return jsoncodec.loads(b"".join(parts))
        return value

    def _writable(self) -> None:
        if self._read_only:
            raise ReadOnlySessionStoreError(
                "this session store is read-only (built for a shared handler); write from the "
                "object's exclusive handler"
            )

    # SessionStore -------------------------------------------------------------------------

    async def load(self, session_id: str) -> SessionRecord | None:
        meta = await self._get(META_KEY)
        if meta is None:
            return None
        self._meta = meta
        # The turn count is not kept anywhere: one key per turn is the whole append.
        count = sum(1 for key in await self._ctx.state_keys() if TURN_KEY.fullmatch(key))
        turns = [SessionTurn.from_json(await self._get(f"tether:turn:{i}")) for i in range(count)]
        runs = [SessionRun.from_json(await self._get(f"tether:run:{r}")) for r in meta["runs"]]
        return SessionRecord(
            id=meta["id"],
            created_at=meta["created_at"],
            metadata=meta["metadata"],
            turns=turns,
            runs=runs,
        )

    async def create(self, record: SessionRecord) -> None:
        self._writable()
        if self._meta is None:
            self._meta = await self._get(META_KEY)
        if self._meta is None:
            self._meta = {
                "id": record.id,
                "created_at": record.created_at,
                "metadata": record.metadata,
                "runs": [],
            }
            self._put(META_KEY, self._meta)

    async def _loaded_meta(self) -> dict[str, Any]:
        if self._meta is None:
            self._meta = await self._get(META_KEY)
        if self._meta is None:
            raise KeyError("no session in this object yet: create_session() first")
        return self._meta

    async def write_turns(self, session_id: str, start: int, turns: Sequence[SessionTurn]) -> None:
        self._writable()
        await self._loaded_meta()
        for offset, turn in enumerate(turns):
            self._put(f"tether:turn:{start + offset}", turn.to_json())

    async def write_run(self, session_id: str, run: SessionRun) -> None:
        self._writable()
        meta = await self._loaded_meta()
        self._put(f"tether:run:{run.id}", run.to_json())
        if run.id not in meta["runs"]:
            meta["runs"].append(run.id)
            self._put(META_KEY, meta)


def restate_session_store(
    ctx: RestateObjectContextLike,
    options: RestateSessionStoreOptions | None = None,
    *,
    clock: Clock | None = None,
    read_only: bool = False,
) -> RestateSessionStore:
    """A `SessionStore` backed by the bound virtual object's state. Single-tenant: bind one
    object key per session. `read_only=True` for a shared handler's context (Restate forbids
    writes there): reads work, every write raises. `clock` stamps timestamps replay-stably
    (default: `ctx.time()`; `restate_runtime` passes its own, coalesced, clock)."""
    if options is not None:
        clock, read_only = options.clock, options.read_only
    return RestateSessionStore(ctx, clock=clock, read_only=read_only)
