"""Waiting for a person on the embedded runtime: the run stops, and resumes once answered.

A call that needs a person (an approval, `ask_human`) looks for its answer in the run's
database (`tether_answers`). Without one it records itself there and raises `Parked`, a control
error: the loop unwinds and `tether run` reports the waiting call and exits. `tether answer`
writes the answer into the same database; running the run again replays its journal up to the
call, finds the answer and journals it as the call's decision step, so every later replay gets
the same decision without reading the table. A deadline (`approvals.timeout`) counts from the
first park and is checked when the run is resumed.

Stopping unwinds the whole run, and interrupts nothing in flight: a call that waits for a person
never runs beside other calls (approval gates, `ask_human` and `spawn` are not
concurrency-safe), in the agent or in a sub-agent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .. import jsoncodec
from .._sqlite import Database
from ..errors import ConfigError
from ..messages import JSON
from ..parked import ParkedKind, summarize
from ..tools.base import ToolContext
from ..tools.human import Answer, Wait
from .errors import DurableControlError


@dataclass(frozen=True)
class WaitingCall:
    """A call of a run that waits for a person."""

    run_id: str
    call_key: str
    """`<run id of the agent or sub-agent>/<call id>`: unique in the run (call ids repeat in
    sub-agents' scopes)."""
    call_id: str
    kind: ParkedKind
    tool: str
    input_summary: str
    parked_at: float
    """Epoch seconds of the first park."""


class Parked(DurableControlError):
    """The run stopped: `call` waits for a person's answer."""

    def __init__(self, call: WaitingCall) -> None:
        super().__init__(f"{call.tool} ({call.call_id}) waits for a person: {call.kind}")
        self.call = call


class AnswerError(ConfigError):
    """An answer that cannot be taken (no such waiting call, or answered already)."""


class AnswerBook:
    """The waiting calls of the runs in one database, and their answers."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def park(self, call: WaitingCall) -> float:
        """Record `call` as waiting (once); returns when it first parked."""
        self._db.execute_commit(
            [
                (
                    "INSERT INTO tether_answers (run_id, call_key, call_id, kind, tool, "
                    "input_summary, parked_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (run_id, call_key) DO NOTHING",
                    (
                        call.run_id,
                        call.call_key,
                        call.call_id,
                        call.kind,
                        call.tool,
                        call.input_summary,
                        call.parked_at,
                    ),
                )
            ]
        )
        rows = self._db.query(
            "SELECT parked_at FROM tether_answers WHERE run_id = ? AND call_key = ?",
            (call.run_id, call.call_key),
        )
        parked_at: float = rows[0][0]
        return parked_at

    def answer_of(self, run_id: str, call_key: str) -> tuple[bool, Any, float | None]:
        """(answered, the answer, when it first parked) of a call."""
        rows = self._db.query(
            "SELECT answer, parked_at FROM tether_answers WHERE run_id = ? AND call_key = ?",
            (run_id, call_key),
        )
        if not rows:
            return False, None, None
        answer, parked_at = rows[0]
        if answer is None:
            return False, None, parked_at
        return True, jsoncodec.loads(answer), parked_at

    def waiting(self, run_id: str | None = None) -> list[WaitingCall]:
        """The calls that wait for an answer (in one run, or in all), oldest first."""
        rows = self._db.query(
            "SELECT run_id, call_key, call_id, kind, tool, input_summary, parked_at "
            "FROM tether_answers WHERE answer IS NULL AND (? IS NULL OR run_id = ?) "
            "ORDER BY parked_at, run_id, call_id",
            (run_id, run_id),
        )
        return [WaitingCall(*row) for row in rows]

    def answer(self, run_id: str, call: str | None, value: JSON) -> WaitingCall:
        """Answer the waiting call `call` (a call id or key) of the run, or its only one."""
        waiting = self.waiting(run_id)
        matching = [c for c in waiting if call is None or call in (c.call_id, c.call_key)]
        if not matching:
            named = f"call {call!r} of run {run_id!r}" if call else f"run {run_id!r}"
            raise AnswerError(f"nothing waits for an answer in {named}")
        if len(matching) > 1:
            keys = ", ".join(c.call_key for c in matching)
            raise AnswerError(f"run {run_id!r} has several waiting calls ({keys}): pass --call")
        [waiting_call] = matching
        self._db.execute_commit(
            [
                (
                    "UPDATE tether_answers SET answer = ?, answered_at = ? "
                    "WHERE run_id = ? AND call_key = ? AND answer IS NULL",
                    (jsoncodec.dumps(value).decode(), time.time(), run_id, waiting_call.call_key),
                )
            ]
        )
        return waiting_call


def embedded_wait(book: AnswerBook, run_id: str, timeout_seconds: float | None) -> Wait:
    """The tools' `Wait` on the embedded runtime of run `run_id` (see the module's doc)."""

    async def wait(tool_ctx: ToolContext, kind: ParkedKind, arguments: dict[str, Any]) -> Answer:
        # Sub-agents run in scopes of their own, where call ids repeat: key by run and call.
        call_key = f"{tool_ctx.run_id}/{tool_ctx.call_id}"

        async def decide() -> JSON:
            answered, value, parked_at = book.answer_of(run_id, call_key)
            if answered:
                return {"value": value}
            now = time.time()
            if parked_at is not None and timeout_seconds and now - parked_at > timeout_seconds:
                return {"timed_out": True}
            call = WaitingCall(
                run_id,
                call_key,
                tool_ctx.call_id,
                kind,
                tool_ctx.tool_name,
                summarize(arguments),
                now,
            )
            book.park(call)
            raise Parked(call)

        # Journaled once decided; raising `Parked` journals nothing, so a resume asks again.
        decided = await tool_ctx.durable.step("decision", f"answer:{tool_ctx.call_id}", decide)
        return Answer(value=decided.get("value"), timed_out=bool(decided.get("timed_out")))

    return wait
