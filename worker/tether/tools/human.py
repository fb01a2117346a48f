"""Tools that wait for a person: the approval gate around a tool, and `ask_human`.

How a call waits belongs to the runtime, behind `Wait`: on Restate it parks on an awakeable and
the invocation suspends (`tether.programs.worker.parking`); on the embedded runtime the run stops
and is resumed once the answer is in its database (`tether.durable.answers`). Either way the answer
is journaled, so a replay gets the same decision. Each decision is also added to the run's record in
the session (`SessionRun.decisions`): the audit trail of who decided what, and when.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..durable.protocol import StepCall
from ..messages import JSON
from ..parked import ParkedKind
from ..session.session import INTERRUPTED_RESULT
from .base import ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec

ASK_HUMAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"question": {"type": "string", "description": "What to ask the person."}},
    "required": ["question"],
}


@dataclass(frozen=True)
class Answer:
    """How a wait for a person ended."""

    value: Any = None
    timed_out: bool = False
    rejected: str | None = None
    """Set when the answer was a rejection: its reason."""


Wait = Callable[[ToolContext, ParkedKind, dict[str, Any]], Awaitable[Answer]]
"""Wait for a person's answer to the call the context is running (kind, call input)."""

DECISION_KEYS = ("approved", "by", "approver", "decided_at")
MAX_DECISION_TEXT = 256


def decision_of(value: Any) -> dict[str, Any]:
    """Who decided, how and when, as a resolution says (`{"approved": true, "by": "link",
    "approver": ..., "decided_at": ...}`); nothing for a value that does not say (`true`, an
    answer). Only short plain values are kept: the resolution comes from outside."""
    if not isinstance(value, dict):
        return {}
    kept: dict[str, Any] = {}
    for key in DECISION_KEYS:
        item = value.get(key)
        if isinstance(item, str):
            kept[key] = item[:MAX_DECISION_TEXT]
        elif key in value and (item is None or isinstance(item, bool | int | float)):
            kept[key] = item
    return kept


async def _record(ctx: ToolContext, kind: ParkedKind, answer: Answer, **outcome: Any) -> None:
    """Add the decision on this call to the run's record (replays rebuild the record, so a
    decision is recorded once however often the run is replayed), and tell the agent's
    `park:end` hooks (on replays too: a hook that counts checks whether the run is live)."""
    entry: dict[str, Any] = {"call_id": ctx.call_id, "tool": ctx.tool_name, "kind": kind}
    entry.update(decision_of(answer.value))
    entry.update(outcome)
    if answer.timed_out:
        entry["timed_out"] = True
    if answer.rejected is not None:
        entry["rejected"] = answer.rejected[:MAX_DECISION_TEXT]
    hooks = getattr(ctx.agent, "hooks", None)  # the agent's `Hooks` (tools sit below it)
    if hooks is not None:
        await hooks.call("park:end", {**entry, "run_id": ctx.run_id})
    if ctx.record_decision is not None:
        await ctx.record_decision(entry)


def _approved(value: Any) -> tuple[bool, str | None]:
    """A resolution is `true`/`false` or `{"approved": bool, "reason": str?}`."""
    if isinstance(value, bool):
        return value, None
    if isinstance(value, dict):
        return bool(value.get("approved")), value.get("reason")
    return False, "the resolution was not an approval"


async def _run_approved(inner: ToolDef, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
    """The approved call, journaled like any tool call (at most once unless replay-safe)."""

    async def body() -> JSON:
        try:
            return {"content": await inner.execute(arguments, ctx), "is_error": False}
        except Exception as error:
            if ctx.durable.is_control_error(error):
                raise
            return {"content": f"{type(error).__name__}: {error}", "is_error": True}

    async def interrupted(_: int) -> JSON:
        if inner.replay == "safe":
            return await body()
        return {"content": INTERRUPTED_RESULT, "is_error": True}

    step = StepCall("tool", f"approved:{ctx.call_id}", body)
    [value] = await ctx.durable.guarded(f"approved-start:{ctx.call_id}", [step], interrupted)
    if value["is_error"]:
        raise ToolError(value["content"])
    output: ToolOutput = value["content"]
    return output


@dataclass(frozen=True)
class Approval:
    """A person's decision on what they were asked to approve."""

    approved: bool
    reason: str | None = None
    """Why not, when not approved."""
    value: Any = None
    """The resolution as given (it may say more: an amount, who decided)."""


async def approval(
    wait: Wait,
    tool_ctx: ToolContext,
    arguments: dict[str, Any],
    on_timeout: Literal["deny", "approve"],
) -> Approval:
    """Wait for a person's approval of what `arguments` describe and record the decision
    (without a decision in time `on_timeout` applies)."""
    answer = await wait(tool_ctx, "approval", arguments)
    reason: str | None
    if answer.rejected is not None:
        approved, reason = False, f"the approval was rejected ({answer.rejected})"
    elif answer.timed_out:
        approved, reason = on_timeout == "approve", "no decision in time"
    else:
        approved, reason = _approved(answer.value)
    await _record(tool_ctx, "approval", answer, approved=approved)
    if approved:
        return Approval(True, value=answer.value)
    return Approval(False, reason or "a person denied it", answer.value)


def approval_gate(inner: ToolDef, wait: Wait, on_timeout: Literal["deny", "approve"]) -> ToolDef:
    """`inner`, waiting for a person's approval before every call. The approval carries the
    tool's name and input; without a decision in time `on_timeout` applies."""

    async def execute(arguments: dict[str, Any], tool_ctx: ToolContext) -> ToolOutput:
        decided = await approval(wait, tool_ctx, arguments, on_timeout)
        if not decided.approved:
            raise ToolError(f"Denied: {decided.reason}. The call was not run.")
        return await _run_approved(inner, arguments, tool_ctx)

    return ToolDef(
        spec=inner.spec,
        execute=execute,
        is_concurrency_safe=False,
        replay=inner.replay,
        self_journaled=True,
    )


def ask_human_tool(name: str, wait: Wait) -> ToolDef:
    """A tool that asks a person a question and waits for the answer."""

    async def execute(arguments: dict[str, Any], tool_ctx: ToolContext) -> ToolOutput:
        answer = await wait(tool_ctx, "ask_human", arguments)
        answered = answer.rejected is None and not answer.timed_out
        await _record(tool_ctx, "ask_human", answer, answered=answered)
        if answer.rejected is not None:
            raise ToolError(f"The person declined to answer ({answer.rejected}).")
        if answer.timed_out:
            raise ToolError("No answer in time.")
        value = answer.value
        if isinstance(value, dict) and "answer" in value:
            value = value["answer"]
        return value if isinstance(value, str) else json.dumps(value)

    return ToolDef(
        spec=ToolSpec(name, "Ask a person a question and wait for the answer.", ASK_HUMAN_SCHEMA),
        execute=execute,
        self_journaled=True,
    )
