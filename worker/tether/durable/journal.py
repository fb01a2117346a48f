"""The journal-backed runtime shared by the memory and SQLite backends.

A journal maps `(scope, position)` to a recorded step. Positions are assigned in call order,
so concurrent steps keep deterministic positions however they complete; a step found at its
position under another name is a journal mismatch, never a silent divergence.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .. import jsoncodec
from ..messages import JSON
from .errors import DurableControlError, JournalMismatchError
from .ids import IdSequence
from .protocol import InterruptedFn, RuntimeStores, StepCall, StepCounters, StepFn, StepKind
from .replay import LiveCallback, ReplayTracker


@dataclass(frozen=True)
class JournalEntry:
    kind: str
    name: str
    value: bytes | str
    """The step result, JSON-encoded."""


class Journal(Protocol):
    """Storage of recorded steps for one run."""

    def get(self, scope: str, seq: int) -> JournalEntry | None: ...

    def last_seq(self, scope: str) -> int:
        """The highest recorded position in `scope`, or -1."""
        ...

    def record(self, scope: str, seq: int, entry: JournalEntry) -> None:
        """Persist one step before the loop moves on."""
        ...


def now_ms() -> float:
    return time.time() * 1000


class JournalRuntime:
    """A `DurableRuntime` over a `Journal`."""

    def __init__(
        self,
        journal: Journal,
        *,
        backend: str,
        run_id: str,
        seed: str,
        stores: RuntimeStores,
        scope: str = "",
        counters: StepCounters | None = None,
        tracker: ReplayTracker | None = None,
    ) -> None:
        self.backend = backend
        self.run_id = run_id
        self.stores = stores
        self.counters = counters or StepCounters()
        self._journal = journal
        self._scope = scope
        self._seed = seed
        self._seq = 0
        self._clock_reads = 0
        self._ids = IdSequence(f"{seed}{scope}")
        self._tracker = tracker or ReplayTracker()

    async def step(self, kind: StepKind, name: str, fn: StepFn) -> JSON:
        seq = self._seq
        self._seq += 1
        return await self._run_at(seq, kind, name, fn)

    async def all(self, calls: Sequence[StepCall]) -> list[JSON]:
        start = self._seq
        self._seq += len(calls)
        async with asyncio.TaskGroup() as group:
            tasks = [
                group.create_task(self._run_at(start + i, call.kind, call.name, call.fn))
                for i, call in enumerate(calls)
            ]
        return [task.result() for task in tasks]

    async def guarded(
        self, intent: str, calls: Sequence[StepCall], interrupted: InterruptedFn
    ) -> list[JSON]:
        # Nothing here suspends: an intent found without a result means the process died.
        started_live = False

        async def mark() -> JSON:
            nonlocal started_live
            started_live = True
            return [c.name for c in calls]

        await self.step("tool", intent, mark)

        def body(index: int, call: StepCall) -> StepCall:
            async def fn() -> JSON:
                return await (call.fn() if started_live else interrupted(index))

            return call._replace(fn=fn)

        guarded = [body(i, c) for i, c in enumerate(calls)]
        if len(guarded) == 1:
            return [await self.step(guarded[0].kind, guarded[0].name, guarded[0].fn)]
        return await self.all(guarded)

    async def _run_at(self, seq: int, kind: StepKind, name: str, fn: StepFn) -> JSON:
        entry = self._journal.get(self._scope, seq)
        if entry is not None:
            if entry.name != name:
                raise JournalMismatchError(self.run_id, self._scope, seq, name, entry.name)
            self.counters.replayed[kind] += 1
            self._tracker.note_replayed()
            return jsoncodec.loads(entry.value)
        await self._tracker.mark_live()
        encoded = jsoncodec.dumps(await fn())
        self._journal.record(self._scope, seq, JournalEntry(kind, name, encoded))
        self.counters.live[kind] += 1
        # Live callers get the decoded copy too, so a live run and its replay see equal values.
        return jsoncodec.loads(encoded)

    def uuid(self) -> str:
        return self._ids.next()

    async def now(self) -> float:
        self._clock_reads += 1

        async def read() -> float:
            return now_ms()

        value: float = await self.step("clock", f"clock:{self._clock_reads}", read)
        return value

    async def sleep(self, ms: float, name: str) -> None:
        async def wake_at() -> float:
            return now_ms() + ms

        deadline: float = await self.step("sleep", name, wake_at)
        remaining = deadline - now_ms()
        if remaining > 0:
            await asyncio.sleep(remaining / 1000)

    def is_control_error(self, error: BaseException) -> bool:
        return isinstance(error, DurableControlError)

    def is_replaying(self) -> bool:
        return self._seq <= self._journal.last_seq(self._scope)

    def hold_writes(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # its stores write at once, outside the journal

    def checkpoint(self) -> None:
        pass

    def on_live(self, callback: LiveCallback) -> None:
        self._tracker.on_live(callback)

    def scope(self, name: str) -> JournalRuntime:
        return JournalRuntime(
            self._journal,
            backend=self.backend,
            run_id=self.run_id,
            seed=self._seed,
            stores=self.stores,
            scope=f"{self._scope}/{name}",
            counters=self.counters,
            tracker=self._tracker,
        )
