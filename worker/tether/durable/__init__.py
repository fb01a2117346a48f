"""Durable runtimes: the protocol the agent loop journals through, and two embedded backends.

The names load on first use (`tether._lazy`): a module that needs `tether.durable.ids` does not
load the SQLite backend with it.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

EXPORTS = {
    ".errors": ("DurableControlError", "JournalMismatchError", "RunClosedError", "RunLeasedError"),
    ".ids": ("deterministic_uuid",),
    ".memory": ("MemoryJournal", "memory_runtime"),
    ".protocol": ("DurableRuntime", "RuntimeStores", "StepCall", "StepCounters", "StepKind"),
    ".sqlite": ("SqliteRuntime", "journal_steps", "run_status", "sqlite_runtime"),
}
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
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

if TYPE_CHECKING:  # what the names are, for type checkers
    from .errors import DurableControlError, JournalMismatchError, RunClosedError, RunLeasedError
    from .ids import deterministic_uuid
    from .memory import MemoryJournal, memory_runtime
    from .protocol import DurableRuntime, RuntimeStores, StepCall, StepCounters, StepKind
    from .sqlite import SqliteRuntime, journal_steps, run_status, sqlite_runtime
