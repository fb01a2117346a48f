"""`Session`: a conversation that outlives runs, kept in a `SessionStore`."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..durable.ids import deterministic_uuid
from ..messages import ContentBlock, Message, tool_result, tool_uses
from .store import Clock, Enough, SessionStore, memory_store
from .types import SessionRecord, SessionRun, SessionTurn

INTERRUPTED_RESULT = (
    "Tool call interrupted: the run stopped before this call recorded a result, so its outcome "
    "is unknown. Check its effects before calling it again."
)


async def _wall_clock() -> float:
    return time.time() * 1000


class Session:
    """Identity, history (`turns`) and run records (`runs`) of a conversation: all of them, or
    the newest when it was loaded from its end (`earlier` counts the rest)."""

    def __init__(self, record: SessionRecord, store: SessionStore, clock: Clock) -> None:
        self.id = record.id
        self.created_at = record.created_at
        self.metadata = record.metadata
        self.turns: list[SessionTurn] = record.turns
        self.runs: list[SessionRun] = record.runs
        self.earlier = record.earlier
        self.store = store
        self.clock = clock
        self._messages: list[Message] = []
        self._assistant_count = (0, 0)
        """(turns counted, assistant turns among them): a cache, rebuilt when it falls behind."""

    @property
    def turn_count(self) -> int:
        """How many turns the conversation has, loaded or not."""
        return self.earlier.turns + len(self.turns)

    @property
    def assistant_turns(self) -> int:
        """How many assistant turns the conversation has (kept up to date as turns append)."""
        if self._assistant_count[0] != len(self.turns):
            count = sum(1 for t in self.turns if t.role == "assistant")
            self._assistant_count = (len(self.turns), count)
        return self.earlier.assistant_turns + self._assistant_count[1]

    @property
    def child_runs(self) -> int:
        """How many of the session's run records are sub-agents' runs, loaded or not."""
        return self.earlier.child_runs + sum(1 for r in self.runs if r.parent_run_id is not None)

    def messages(self) -> list[Message]:
        """The turns as provider messages (a new list; the blocks are shared, not copied)."""
        if len(self._messages) != len(self.turns):
            self._messages = [{"role": t.role, "content": t.content} for t in self.turns]
        return list(self._messages)

    async def append_turns(self, turns: Sequence[SessionTurn]) -> None:
        start = len(self.turns)
        self.turns.extend(turns)
        if len(self._messages) == start:
            self._messages.extend([{"role": t.role, "content": t.content} for t in turns])
        counted, assistants = self._assistant_count
        if counted == start:
            added = [t.role for t in turns].count("assistant")
            self._assistant_count = (start + len(turns), assistants + added)
        await self.store.write_turns(self.id, self.earlier.turns + start, turns)

    async def save_run(self, run: SessionRun) -> None:
        for i, existing in enumerate(self.runs):
            if existing.id == run.id:
                self.runs[i] = run
                break
        else:
            self.runs.append(run)
        await self.store.write_run(self.id, run)

    def run(self, run_id: str) -> SessionRun | None:
        return next((r for r in self.runs if r.id == run_id), None)

    async def heal_interrupted_tool_calls(self) -> int:
        """Give every tool call without a result an error result saying it was interrupted.

        A process that died between a model answer and its tool results leaves tool calls that
        providers reject. Call this in the session's single writer before resuming. Returns the
        number of calls healed; runs still marked `running` become `interrupted`. Only the
        turns and runs loaded are looked at.
        """
        healed = 0
        position = 0
        first_changed: int | None = None
        while position < len(self.turns):
            turn = self.turns[position]
            calls = tool_uses(turn.content) if turn.role == "assistant" else []
            if not calls:
                position += 1
                continue
            nxt = self.turns[position + 1] if position + 1 < len(self.turns) else None
            answered = {
                b["tool_use_id"] for b in (nxt.content if nxt else []) if b["type"] == "tool_result"
            }
            missing: list[ContentBlock] = [
                tool_result(c["id"], INTERRUPTED_RESULT, is_error=True)
                for c in calls
                if c["id"] not in answered
            ]
            if missing:
                healed += len(missing)
                now = await self.clock()
                if nxt is not None and answered:
                    nxt.content = [*nxt.content, *missing]
                else:
                    self.turns.insert(
                        position + 1,
                        SessionTurn(
                            id=deterministic_uuid(f"{self.id}:healed:{turn.id}"),
                            role="user",
                            content=missing,
                            created_at=now,
                            run_id=turn.run_id,
                        ),
                    )
                first_changed = position + 1 if first_changed is None else first_changed
            position += 2
        if first_changed is not None:
            self._messages = []
            await self.store.write_turns(
                self.id, self.earlier.turns + first_changed, self.turns[first_changed:]
            )
        for run in self.runs:
            if run.status == "running":
                run.status = "interrupted"
                run.ended_at = await self.clock()
                await self.store.write_run(self.id, run)
        return healed


async def create_session(
    *,
    id: str | None = None,
    store: SessionStore | None = None,
    metadata: dict[str, Any] | None = None,
    clock: Clock | None = None,
) -> Session:
    """Create a session (or open it, if the store already has this id).

    Pass `id` inside a durable run: a generated id is not replay-stable."""
    store = store or memory_store()
    clock = clock or store.clock or _wall_clock
    existing = await store.load(id) if id else None
    if existing is not None:
        return Session(existing, store, clock)
    record = SessionRecord(
        id=id or str(uuid.uuid4()), created_at=await clock(), metadata=dict(metadata or {})
    )
    await store.create(record)
    return Session(record, store, clock)


async def load_session(
    store: SessionStore, id: str, clock: Clock | None = None, enough: Enough | None = None
) -> Session | None:
    """The session `id` from `store`, or None when the store has no such session. With
    `enough`, the store may load only the newest turns of which `enough` holds (see
    `SessionStore.load`)."""
    record = await store.load(id, enough) if enough is not None else await store.load(id)
    if record is None:
        return None
    return Session(record, store, clock or store.clock or _wall_clock)
