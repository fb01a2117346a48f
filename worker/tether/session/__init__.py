"""Sessions: conversations that outlive runs, and the stores that keep them."""

from .session import INTERRUPTED_RESULT, Session, create_session, load_session
from .sqlite import SqliteSessionStore, SqliteToolStateStore, sqlite_store
from .store import (
    MemorySessionStore,
    MemoryToolStateStore,
    SessionStore,
    ToolStateStore,
    memory_store,
)
from .types import RunStatus, SessionRecord, SessionRun, SessionTurn

__all__ = [
    "INTERRUPTED_RESULT",
    "MemorySessionStore",
    "MemoryToolStateStore",
    "RunStatus",
    "Session",
    "SessionRecord",
    "SessionRun",
    "SessionStore",
    "SessionTurn",
    "SqliteSessionStore",
    "SqliteToolStateStore",
    "ToolStateStore",
    "create_session",
    "load_session",
    "memory_store",
    "sqlite_store",
]
