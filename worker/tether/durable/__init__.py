"""Durable runtimes: the protocol the agent loop journals through, and two embedded backends."""

from .errors import DurableControlError, JournalMismatchError, RunClosedError, RunLeasedError
from .ids import deterministic_uuid
from .memory import MemoryJournal, memory_runtime
from .protocol import DurableRuntime, RuntimeStores, StepCall, StepCounters, StepKind
from .sqlite import SqliteRuntime, journal_steps, run_status, sqlite_runtime

__all__ = [
    "DurableControlError",
    "DurableRuntime",
    "JournalMismatchError",
    "MemoryJournal",
    "RunClosedError",
    "RunLeasedError",
    "RuntimeStores",
    "SqliteRuntime",
    "StepCall",
    "StepCounters",
    "StepKind",
    "deterministic_uuid",
    "journal_steps",
    "memory_runtime",
    "run_status",
    "sqlite_runtime",
]
