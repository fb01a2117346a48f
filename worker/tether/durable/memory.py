"""The in-memory runtime: the loop's semantics without persistence.

Its journal can be shared by several runtimes in one process, which replays a run exactly as a
durable backend would (useful to test replay without a crash).
"""

from __future__ import annotations

import uuid as uuid_module

from .journal import JournalEntry, JournalRuntime
from .protocol import RuntimeStores


class MemoryJournal:
    """Recorded steps held in a dict."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, int], JournalEntry] = {}
        self._last: dict[str, int] = {}

    def get(self, scope: str, seq: int) -> JournalEntry | None:
        return self.entries.get((scope, seq))

    def last_seq(self, scope: str) -> int:
        return self._last.get(scope, -1)

    def record(self, scope: str, seq: int, entry: JournalEntry) -> None:
        self.entries[(scope, seq)] = entry
        self._last[scope] = max(seq, self._last.get(scope, -1))

    def names(self, scope: str = "") -> list[str]:
        """Step names of `scope` in position order."""
        return [e.name for (s, _), e in sorted(self.entries.items()) if s == scope]


def memory_runtime(
    *, journal: MemoryJournal | None = None, run_id: str | None = None, id_seed: str | None = None
) -> JournalRuntime:
    """A runtime that journals in memory. Pass the same `journal` (and `id_seed`) to a second
    runtime to replay the first one's run."""
    from ..budget import MemoryLedger
    from ..session.events import MemoryEventLog
    from ..session.store import memory_store

    run_id = run_id or str(uuid_module.uuid4())
    return JournalRuntime(
        journal or MemoryJournal(),
        backend="memory",
        run_id=run_id,
        seed=id_seed or run_id,
        stores=RuntimeStores(
            session=memory_store(), events=MemoryEventLog(), budget=MemoryLedger()
        ),
    )
