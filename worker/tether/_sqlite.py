"""One SQLite file for journals, sessions and tool state (WAL mode)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from .errors import ConfigError

Synchronous = Literal["FULL", "NORMAL"]
T = TypeVar("T")
Params = Sequence[Any]

SCHEMA_VERSION = 1
"""The schema below, stamped in each database (`PRAGMA user_version`). A database from before
the stamp (0) has this schema. A change to it adds a version and the statements that bring an
older database up to it; a database a newer Tether wrote is refused, not guessed at: its runs'
journals may hold steps this code would replay wrong. A table of its own that older code never
reads (`tether_spend`) needs no new version: each open creates it."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS tether_runs (
  run_id TEXT PRIMARY KEY, status TEXT NOT NULL, owner TEXT,
  created_at REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tether_steps (
  run_id TEXT NOT NULL, scope TEXT NOT NULL, seq INTEGER NOT NULL,
  kind TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, at REAL NOT NULL,
  PRIMARY KEY (run_id, scope, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tether_sessions (
  id TEXT PRIMARY KEY, created_at REAL NOT NULL, metadata TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tether_turns (
  session_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL, role TEXT NOT NULL,
  content TEXT NOT NULL, usage TEXT, created_at REAL NOT NULL, run_id TEXT,
  PRIMARY KEY (session_id, position)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tether_session_runs (
  session_id TEXT NOT NULL, run_id TEXT NOT NULL, started_at REAL NOT NULL, data TEXT NOT NULL,
  PRIMARY KEY (session_id, run_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tether_answers (
  run_id TEXT NOT NULL, call_key TEXT NOT NULL, call_id TEXT NOT NULL, kind TEXT NOT NULL,
  tool TEXT NOT NULL, input_summary TEXT NOT NULL, parked_at REAL NOT NULL,
  answer TEXT, answered_at REAL,
  PRIMARY KEY (run_id, call_key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tether_tool_state (
  session_id TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
  PRIMARY KEY (session_id, tool, key)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tether_budgets (tree TEXT PRIMARY KEY, limits TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tether_spend (agent TEXT PRIMARY KEY, windows TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tether_budget_calls (
  tree TEXT NOT NULL, key TEXT NOT NULL, cost_usd REAL NOT NULL, tokens INTEGER NOT NULL,
  settled INTEGER NOT NULL, PRIMARY KEY (tree, key)) WITHOUT ROWID;
"""


class Database:
    """A connection with Tether's schema. Writes are either committed at once (`execute_commit`)
    or staged to ride on the next commit, so a step result and the state it implies land in one
    transaction."""

    committed: ClassVar[Callable[[Sequence[tuple[str, Params]]], None] | None] = None
    """Told of every transaction of the process once it is committed, with its writes (none
    for `exclusive`'s): `tether crashtest` kills its runs there, at each boundary. It must not
    raise: the transaction is committed."""

    def __init__(self, path: str | Path, *, synchronous: Synchronous = "FULL") -> None:
        self.path = str(path)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA busy_timeout=10000")
        found = self._schema_version()  # before anything is written to a file it may refuse
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        self._conn.executescript(SCHEMA)
        if found < SCHEMA_VERSION:
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        self._staged: list[tuple[str, Params]] = []
        self._lock = threading.Lock()
        # One cursor for every commit: `Connection.execute` builds a new one per statement, a
        # share of each step's commit.
        self._writer = self._conn.cursor()

    def _schema_version(self) -> int:
        """The file's schema version; a newer one than this code's is refused."""
        (found,) = self._conn.execute("PRAGMA user_version").fetchone()
        if found > SCHEMA_VERSION:
            self._conn.close()
            raise ConfigError(
                f"{self.path} was written by a newer Tether (database schema {found}; this one "
                f"reads up to {SCHEMA_VERSION}): upgrade tether to open it, or use another file"
            )
        return int(found)

    def query(self, sql: str, params: Params = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def stage(self, sql: str, params: Params) -> None:
        self._staged.append((sql, params))

    def execute_commit(self, writes: Sequence[tuple[str, Params]] = ()) -> None:
        """Commit the staged writes and `writes` in one transaction."""
        with self._lock:
            batch, self._staged = [*self._staged, *writes], []
            if not batch:
                return
            writer = self._writer
            writer.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in batch:
                    writer.execute(sql, params)
                writer.execute("COMMIT")
            except BaseException:
                writer.execute("ROLLBACK")
                raise
        if Database.committed is not None:
            Database.committed(batch)

    def exclusive(self, work: Callable[[sqlite3.Cursor], T]) -> T:
        """`work` in one write transaction, begun at once: what it reads, no other process
        writes before it commits."""
        with self._lock:
            writer = self._writer
            writer.execute("BEGIN IMMEDIATE")
            try:
                result = work(writer)
                writer.execute("COMMIT")
            except BaseException:
                writer.execute("ROLLBACK")
                raise
        if Database.committed is not None:
            Database.committed(())
        return result

    def close(self) -> None:
        with self._lock:
            self._conn.close()
