"""The embedded SQLite runtime: a journal in a local file that survives `kill -9`.

Each step's result is committed (WAL) before the loop moves on, together with the session
writes it implies. Running the same `run_id` again replays the committed steps and continues
live. A lock file per run keeps a second process out while the first one lives; the kernel
drops the lock when the holder dies, so a killed run can be resumed at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO

from .._sqlite import Database, Synchronous
from ..budget import SqliteLedger
from ..session.events import MemoryEventLog
from ..session.sqlite import SqliteSessionStore
from .errors import RunClosedError, RunLeasedError
from .journal import JournalEntry, JournalRuntime, now_ms
from .protocol import RuntimeStores


class SqliteJournal:
    """The steps of one run, loaded at open and appended one commit per step."""

    def __init__(self, db: Database, run_id: str) -> None:
        self._db = db
        self._run_id = run_id
        self._entries: dict[tuple[str, int], JournalEntry] = {}
        self._last: dict[str, int] = {}
        for scope, seq, kind, name, value in db.query(
            "SELECT scope, seq, kind, name, value FROM tether_steps WHERE run_id = ?", (run_id,)
        ):
            self._entries[(scope, seq)] = JournalEntry(kind, name, value)
            self._last[scope] = max(seq, self._last.get(scope, -1))
        self.closed = False

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, scope: str, seq: int) -> JournalEntry | None:
        return self._entries.get((scope, seq))

    def last_seq(self, scope: str) -> int:
        return self._last.get(scope, -1)

    def record(self, scope: str, seq: int, entry: JournalEntry) -> None:
        if self.closed:
            raise RunClosedError(f"the SQLite runtime of run {self._run_id!r} is closed")
        self._db.execute_commit(
            [
                (
                    "INSERT INTO tether_steps (run_id, scope, seq, kind, name, value, at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (self._run_id, scope, seq, entry.kind, entry.name, entry.value, now_ms()),
                )
            ]
        )
        self._entries[(scope, seq)] = entry
        self._last[scope] = max(seq, self._last.get(scope, -1))


class RunLease:
    """An exclusive `flock` on a per-run lock file beside the database."""

    def __init__(self, db_path: str, run_id: str) -> None:
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:32]
        lock_dir = Path(f"{db_path}.locks")
        lock_dir.mkdir(exist_ok=True)
        self.path = lock_dir / f"{digest}.lock"
        self._file: IO[str] | None = open(self.path, "a+")  # noqa: SIM115 (held until release)
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            self._file = None
            raise RunLeasedError(
                f"run {run_id!r} is already running in {holder}; wait for it to finish or "
                "stop it before resuming (a killed process releases the run at once)"
            ) from None
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()}")
        self._file.flush()

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
            self._file = None


class SqliteRuntime(JournalRuntime):
    """A `DurableRuntime` journaling into SQLite. Use it as a context manager, or call
    `close(status)` when the run ends."""

    def __init__(self, path: str | Path, run_id: str, *, synchronous: Synchronous = "FULL") -> None:
        self.db = Database(path, synchronous=synchronous)
        try:
            self._lease = RunLease(self.db.path, run_id)
        except BaseException:
            self.db.close()
            raise
        self.journal = SqliteJournal(self.db, run_id)
        self.resuming = len(self.journal) > 0
        session_store = SqliteSessionStore(
            self.db, deferred=True, snapshot=self._snapshot, clock=self.now
        )
        super().__init__(
            self.journal,
            backend="sqlite",
            run_id=run_id,
            seed=run_id,
            stores=RuntimeStores(
                session=session_store, events=MemoryEventLog(), budget=SqliteLedger(self.db)
            ),
        )
        self._set_status("running")

    async def _snapshot(self, session_id: str, count: Callable[[], Awaitable[int]]) -> int:
        value: int = await self.step("state", f"session-load:{session_id}", count)
        return value

    def _set_status(self, status: str) -> None:
        now = now_ms()
        self.db.execute_commit(
            [
                (
                    "INSERT INTO tether_runs (run_id, status, owner, created_at, updated_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
                    "status = excluded.status, owner = excluded.owner, "
                    "updated_at = excluded.updated_at",
                    (self.run_id, status, f"pid {os.getpid()}", now, now),
                )
            ]
        )

    def close(self, status: str | None = None) -> None:
        """Commit staged writes, record the run's final status and release the run."""
        if self.journal.closed:
            return
        if status is not None:
            self._set_status(status)
        self.db.execute_commit()
        self.journal.closed = True
        self._lease.release()
        self.db.close()

    def __enter__(self) -> SqliteRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sqlite_runtime(
    path: str | Path, run_id: str, *, synchronous: Synchronous = "FULL"
) -> SqliteRuntime:
    """Open (or resume) run `run_id` in the SQLite file at `path`.

    `synchronous="FULL"` (the default) also survives power loss; `"NORMAL"` survives a killed
    process but may lose the last commits on an OS crash.
    """
    return SqliteRuntime(path, run_id, synchronous=synchronous)


def run_status(path: str | Path, run_id: str) -> str | None:
    """The recorded status of a run, or None if the file has no such run."""
    db = Database(path)
    try:
        rows = db.query("SELECT status FROM tether_runs WHERE run_id = ?", (run_id,))
        return str(rows[0][0]) if rows else None
    finally:
        db.close()


def journal_steps(path: str | Path, run_id: str) -> list[tuple[str, int, str, str]]:
    """The committed steps of a run as `(scope, seq, kind, name)`, in order."""
    db = Database(path)
    try:
        rows = db.query(
            "SELECT scope, seq, kind, name FROM tether_steps WHERE run_id = ? ORDER BY scope, seq",
            (run_id,),
        )
        return [(str(a), int(b), str(c), str(d)) for a, b, c, d in rows]
    finally:
        db.close()


__all__ = ["SqliteRuntime", "journal_steps", "run_status", "sqlite_runtime"]
