"""Where sessions and tool state live: the store protocols and the in-memory stores."""

from __future__ import annotations

import copy
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import TetherError
from .types import SessionRecord, SessionRun, SessionTurn

Clock = Callable[[], Awaitable[float]]
"""An async clock in epoch milliseconds (a durable runtime's `now`)."""
Enough = Callable[[list[dict[str, Any]]], bool]
"""Whether the newest turns (as JSON, in order) are all a reader needs (`SessionStore.load`)."""


def every_turn(turns: list[dict[str, Any]]) -> bool:
    """The `Enough` of a reader that needs every turn, but only the newest run records (a run
    whose model gets the whole transcript)."""
    return False


DEFAULT_MAX_VALUE_BYTES = 64 * 1024


@runtime_checkable
class SessionStore(Protocol):
    """Persistence for sessions. Writes are idempotent: a replay that writes the same turn at
    the same position, or the same run record, changes nothing."""

    clock: Clock | None
    """The store's replay-stable clock, when it is bound to a durable runtime."""

    async def load(self, session_id: str, enough: Enough | None = None) -> SessionRecord | None:
        """The session, or None. With `enough`, a store may read it from its end: the newest
        turns of which `enough` holds (or all), and the newest run records, counting what it
        leaves out in `SessionRecord.earlier`; a store that reads everything ignores it."""
        ...

    async def create(self, record: SessionRecord) -> None: ...

    async def write_turns(self, session_id: str, start: int, turns: Sequence[SessionTurn]) -> None:
        """Store `turns` at positions `start`, `start + 1`, ... (replacing what is there)."""
        ...

    async def write_run(self, session_id: str, run: SessionRun) -> None:
        """Insert or replace the run record with `run.id`."""
        ...


@runtime_checkable
class ToolStateStore(Protocol):
    """Per-session key-value state for tools, namespaced by tool name."""

    async def get(self, tool: str, key: str) -> Any: ...

    async def set(self, tool: str, key: str, value: Any) -> None: ...

    async def delete(self, tool: str, key: str) -> None: ...


class ToolStateTooLargeError(TetherError, ValueError):
    """A tool-state value over the per-value budget (it would become a poison pill later)."""


def check_value_size(tool: str, key: str, value: Any, limit: int) -> str:
    encoded = json.dumps(value, separators=(",", ":"))
    if len(encoded.encode()) > limit:
        raise ToolStateTooLargeError(
            f"tool state {tool}/{key} is {len(encoded.encode())} bytes, over the {limit}-byte "
            "budget; store a reference to the data instead of the data"
        )
    return encoded


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data (what turns hold), several times faster than
    `copy.deepcopy`, which every turn a run appends went through; anything else in it is
    deep-copied as before."""
    kind = type(value)
    if kind is dict:
        return {key: _copy_json(item) for key, item in value.items()}
    if kind is list:
        return [_copy_json(item) for item in value]
    return value if kind in _SCALARS else copy.deepcopy(value)


def _copy_turn(turn: SessionTurn) -> SessionTurn:
    """A copy of `turn` that shares nothing with it (its fields are its `__init__`'s)."""
    return type(turn)(**_copy_json(vars(turn)))


class MemorySessionStore:
    """Sessions in a dict (copies in and out, so callers cannot alias stored state)."""

    clock: Clock | None = None

    def __init__(self) -> None:
        self._records: dict[str, SessionRecord] = {}

    async def load(self, session_id: str, enough: Enough | None = None) -> SessionRecord | None:
        record = self._records.get(session_id)
        return copy.deepcopy(record) if record else None

    async def create(self, record: SessionRecord) -> None:
        self._records.setdefault(record.id, copy.deepcopy(record))

    async def write_turns(self, session_id: str, start: int, turns: Sequence[SessionTurn]) -> None:
        stored = self._records[session_id].turns
        for offset, turn in enumerate(turns):
            position = start + offset
            if position < len(stored):
                stored[position] = _copy_turn(turn)
            else:
                stored.append(_copy_turn(turn))

    async def write_run(self, session_id: str, run: SessionRun) -> None:
        runs = self._records[session_id].runs
        for i, existing in enumerate(runs):
            if existing.id == run.id:
                runs[i] = copy.deepcopy(run)
                return
        runs.append(copy.deepcopy(run))


class MemoryToolStateStore:
    """Tool state in a dict, with the same size budget as the durable stores."""

    def __init__(self, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        self._values: dict[tuple[str, str], str] = {}
        self._limit = max_value_bytes

    async def get(self, tool: str, key: str) -> Any:
        encoded = self._values.get((tool, key))
        return None if encoded is None else json.loads(encoded)

    async def set(self, tool: str, key: str, value: Any) -> None:
        self._values[(tool, key)] = check_value_size(tool, key, value, self._limit)

    async def delete(self, tool: str, key: str) -> None:
        self._values.pop((tool, key), None)


def memory_store() -> MemorySessionStore:
    """A session store in process memory."""
    return MemorySessionStore()
