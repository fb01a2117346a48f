"""The contract between the agent loop and a durable backend.

The loop calls only these members for anything that is not a pure function of its inputs and of
earlier step results. Every backend (memory, SQLite, Restate) keeps the same rules: a step runs
its function once and returns the journaled value ever after; ids and clock reads are
replay-stable; control errors escape the loop.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol, runtime_checkable

from ..messages import JSON
from .replay import LiveCallback

if TYPE_CHECKING:
    from ..budget import BudgetLedger
    from ..session.events import EventLog
    from ..session.store import SessionStore, ToolStateStore

StepKind = Literal["model", "tool", "decision", "sleep", "state", "clock"]
StepFn = Callable[[], Awaitable[JSON]]


InterruptedFn = Callable[[int], Awaitable[JSON]]


class StepCall(NamedTuple):
    """One step of a concurrent batch (`DurableRuntime.all`)."""

    kind: StepKind
    name: str
    fn: StepFn


@dataclass
class RuntimeStores:
    """The stores that live with the runtime (for Restate: in the virtual object's state)."""

    session: SessionStore | None = None
    tool_state: ToolStateStore | None = None
    events: EventLog | None = None
    """Where runs append the events people watch (`tether.session.events`); none: no events."""
    budget: BudgetLedger | None = None
    """Where a budgeted run and its sub-agents reserve each model call (`tether.budget`); none:
    each run checks its own budget alone."""


@dataclass
class StepCounters:
    """How many steps ran live and how many were answered from the journal, by kind."""

    live: Counter[str] = field(default_factory=Counter)
    replayed: Counter[str] = field(default_factory=Counter)


@runtime_checkable
class DurableRuntime(Protocol):
    """What the agent loop needs from a durable backend."""

    backend: str
    """`"memory"`, `"sqlite"` or `"restate"`."""
    run_id: str
    stores: RuntimeStores
    counters: StepCounters

    async def step(self, kind: StepKind, name: str, fn: StepFn) -> JSON:
        """Run `fn` once and journal its JSON result under `name`; replay the result after.

        Step names are unique within a scope. `fn` must not use the runtime itself."""
        ...

    async def all(self, calls: Sequence[StepCall]) -> list[JSON]:
        """Run several steps concurrently; journal positions and results keep call order."""
        ...

    async def guarded(
        self, intent: str, calls: Sequence[StepCall], interrupted: InterruptedFn
    ) -> list[JSON]:
        """Run side effects at most once: journal the intent `intent`, then the calls
        (concurrently when there are several). When a replay finds the intent but not a call's
        result, the process died while that call could have been running: its value is
        `interrupted(index)` instead of a second run of its body. When the journal cannot tell
        "died mid-call" from "never started" (on Restate: the attempt that journaled the intent
        ended, and no process that saw how is here to say), the call is reported interrupted."""
        ...

    def uuid(self) -> str:
        """A replay-stable id (hashed from the runtime's seed and a counter)."""
        ...

    async def now(self) -> float:
        """A journaled clock read, epoch milliseconds."""
        ...

    async def sleep(self, ms: float, name: str) -> None:
        """A durable wait: a replay does not wait again for time already slept."""
        ...

    def hold_writes(self) -> AbstractContextManager[None]:
        """A run's block: within it the backend may hold the stores' writes back and send them
        together at the next checkpoint (a model step, a sleep, `checkpoint()`) and at the
        block's end. Blocks nest (an in-process sub-agent's run)."""
        ...

    def checkpoint(self) -> None:
        """Send the writes held so far: the run is about to wait for something other than a
        step of its own (a person, a sub-agent), and its session should show why."""
        ...

    def is_control_error(self, error: BaseException) -> bool:
        """True for errors that must escape the loop unchanged (suspension, cancellation...)."""
        ...

    def is_replaying(self) -> bool:
        """True while steps are still being answered from the journal."""
        ...

    def on_live(self, callback: LiveCallback) -> None:
        """Call `callback` once, when the first step runs live after at least one replayed."""
        ...

    def scope(self, name: str) -> DurableRuntime:
        """A runtime over a sub-journal (an in-process sub-agent): own ids and step positions."""
        ...
