"""Sessions and tool state in SQLite."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from .. import jsoncodec
from .._sqlite import Database, Params
from .store import DEFAULT_MAX_VALUE_BYTES, Clock, Enough, check_value_size
from .types import SessionRecord, SessionRun, SessionTurn

Snapshot = Callable[[str, Callable[[], Awaitable[int]]], Awaitable[int]]
"""Journals the turn count seen at load, so a replayed load sees the session as it was."""


def _dump(value: Any) -> str:
    return jsoncodec.dumps(value).decode()


class SqliteSessionStore:
    """A `SessionStore` in SQLite.

    Standalone (`sqlite_store(path)`) every write commits. Bound to the SQLite runtime, writes
    ride on the next journal commit and `load` is journaled, which gives a resumed run the same
    view of the session as its first attempt had.
    """

    def __init__(
        self,
        db: Database,
        *,
        deferred: bool = False,
        snapshot: Snapshot | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.db = db
        self.clock = clock
        self._deferred = deferred
        self._snapshot = snapshot

    def _write(self, sql: str, params: Params) -> None:
        if self._deferred:
            self.db.stage(sql, params)
        else:
            self.db.execute_commit([(sql, params)])

    async def load(self, session_id: str, enough: Enough | None = None) -> SessionRecord | None:
        async def count() -> int:
            rows = self.db.query(
                "SELECT COUNT(*) FROM tether_sessions s LEFT JOIN tether_turns t "
                "ON t.session_id = s.id WHERE s.id = ? GROUP BY s.id",
                (session_id,),
            )
            return int(rows[0][0]) if rows else -1

        turn_count = await (self._snapshot(session_id, count) if self._snapshot else count())
        if turn_count < 0:
            return None
        ((created_at, metadata),) = self.db.query(
            "SELECT created_at, metadata FROM tether_sessions WHERE id = ?", (session_id,)
        )
        turns = [
            SessionTurn(
                id=row[0],
                role=row[1],
                content=jsoncodec.loads(row[2]),
                usage=jsoncodec.loads(row[3]) if row[3] else None,
                created_at=row[4],
                run_id=row[5],
            )
            for row in self.db.query(
                "SELECT id, role, content, usage, created_at, run_id FROM tether_turns "
                "WHERE session_id = ? AND position < ? ORDER BY position",
                (session_id, turn_count),
            )
        ]
        runs = [
            SessionRun.from_json(jsoncodec.loads(row[0]))
            for row in self.db.query(
                "SELECT data FROM tether_session_runs WHERE session_id = ? "
                "ORDER BY started_at, run_id",
                (session_id,),
            )
        ]
        return SessionRecord(
            id=session_id,
            created_at=created_at,
            metadata=jsoncodec.loads(metadata),
            turns=turns,
            runs=runs,
        )

    async def create(self, record: SessionRecord) -> None:
        self._write(
            "INSERT OR IGNORE INTO tether_sessions (id, created_at, metadata) VALUES (?, ?, ?)",
            (record.id, record.created_at, _dump(record.metadata)),
        )

    async def write_turns(self, session_id: str, start: int, turns: Sequence[SessionTurn]) -> None:
        for offset, turn in enumerate(turns):
            self._write(
                "INSERT OR REPLACE INTO tether_turns "
                "(session_id, position, id, role, content, usage, created_at, run_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    start + offset,
                    turn.id,
                    turn.role,
                    _dump(turn.content),
                    _dump(turn.usage) if turn.usage else None,
                    turn.created_at,
                    turn.run_id,
                ),
            )

    async def write_run(self, session_id: str, run: SessionRun) -> None:
        self._write(
            "INSERT OR REPLACE INTO tether_session_runs (session_id, run_id, started_at, data) "
            "VALUES (?, ?, ?, ?)",
            (session_id, run.id, run.started_at, _dump(run.to_json())),
        )


class SqliteToolStateStore:
    """Tool state of one session in SQLite, with a per-value size budget."""

    def __init__(
        self,
        db: Database,
        session_id: str,
        *,
        deferred: bool = False,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        self.db = db
        self._session_id = session_id
        self._deferred = deferred
        self._limit = max_value_bytes

    def _write(self, sql: str, params: Params) -> None:
        if self._deferred:
            self.db.stage(sql, params)
        else:
            self.db.execute_commit([(sql, params)])

    async def get(self, tool: str, key: str) -> Any:
        rows = self.db.query(
            "SELECT value FROM tether_tool_state WHERE session_id = ? AND tool = ? AND key = ?",
            (self._session_id, tool, key),
        )
        return jsoncodec.loads(rows[0][0]) if rows else None

    async def set(self, tool: str, key: str, value: Any) -> None:
        encoded = check_value_size(tool, key, value, self._limit)
        self._write(
            "INSERT OR REPLACE INTO tether_tool_state (session_id, tool, key, value) "
            "VALUES (?, ?, ?, ?)",
            (self._session_id, tool, key, encoded),
        )

    async def delete(self, tool: str, key: str) -> None:
        self._write(
            "DELETE FROM tether_tool_state WHERE session_id = ? AND tool = ? AND key = ?",
            (self._session_id, tool, key),
        )


def sqlite_store(path: str | Path) -> SqliteSessionStore:
    """A standalone session store in the SQLite file at `path` (every write commits)."""
    return SqliteSessionStore(Database(path))
