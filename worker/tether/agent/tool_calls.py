"""Executing one turn's tool calls as journaled steps.

Every call gets exactly one result, in call order. Concurrency-safe calls next to each other
run together (up to `max_concurrent_tools`); anything else runs alone. Before a group with a
`replay="unsafe"` tool runs, an intent step is journaled: if a replay finds the intent but no
result, the call was cut off by a crash and is reported as interrupted instead of run again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from ..durable.journal import now_ms
from ..durable.protocol import StepCall
from ..messages import JSON, ToolResultBlock, ToolUseBlock, tool_result
from ..session.session import INTERRUPTED_RESULT
from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput
from ..tools.validation import InputValidator, validator_for
from .abort import Aborted

if TYPE_CHECKING:
    from ..durable.protocol import DurableRuntime
    from .abort import AbortSignal
    from .agent import Agent
    from .behavior import Behavior
    from .stats import AgentStats

ABORTED_RESULT = "Aborted: the run was aborted while this tool was running."


def plan_groups(
    calls: list[ToolUseBlock], tools: dict[str, ToolDef], max_concurrent: int
) -> list[list[ToolUseBlock]]:
    """Split a turn's calls into groups that run together, keeping call order."""
    groups: list[list[ToolUseBlock]] = []
    previous_parallel = False
    for call in calls:
        tool = tools.get(call["name"])
        parallel = (
            max_concurrent > 1
            and tool is not None
            and tool.is_concurrency_safe
            and not tool.self_journaled
        )
        if parallel and previous_parallel:
            groups[-1].append(call)
        else:
            groups.append([call])
        previous_parallel = parallel
    return groups


def cap_text(text: str, limit: int) -> str:
    """`text` if it fits `limit` bytes, else its head and tail around an omission marker."""
    data = text.encode()
    if len(data) <= limit:
        return text
    half = limit // 2
    omitted = len(data) - 2 * half
    head = data[:half].decode(errors="ignore")
    tail = data[-half:].decode(errors="ignore")
    return f"{head}\n[... {omitted} bytes omitted ...]\n{tail}"


def cap_output(output: ToolOutput, limit: int | None) -> ToolOutput:
    if limit is None:
        return output
    if isinstance(output, str):
        return cap_text(output, limit)
    return [
        {"type": "text", "text": cap_text(b["text"], limit)} if b["type"] == "text" else b
        for b in output
    ]


def _outcome(
    content: ToolOutput, *, outcome: str, is_error: bool, duration_s: float | None = None
) -> dict[str, Any]:
    value = {"content": content, "is_error": is_error, "outcome": outcome, "at": now_ms()}
    if duration_s is not None:
        value["duration_s"] = round(duration_s, 6)
    return value


@dataclass(frozen=True)
class ToolRun:
    """What executing a run's tool calls uses of the run (and no more: no back-reference)."""

    agent: Agent
    """Its hooks, depth and tool extras; a spawn tool builds a child from it."""
    tools: Sequence[ToolDef]
    """The run's tools: the agent's, and its toolsets' as listed when the run started."""
    durable: DurableRuntime
    behavior: Behavior
    abort: AbortSignal
    stats: AgentStats
    run_id: str
    session_id: str | None
    record_decision: Callable[[dict[str, Any]], Awaitable[None]]
    live: Callable[..., None] = lambda kind, **fields: None
    """Passes on a live event (a tool call started: its kind and fields) to the session's
    stream."""
    budget_tree: str | None = None


class ToolCallExecutor:
    """Runs the tool calls of one run's turns through the run's durable runtime."""

    def __init__(self, run: ToolRun) -> None:
        self.run = run
        self.tools = {t.name: t for t in run.tools}
        self._validators: dict[str, InputValidator] = {}
        """By tool name, made at its first call: most runs call few of their tools."""
        self.turn = 0
        """The number of the turn whose calls run (the hooks' `turn`)."""

    async def execute(
        self, calls: list[ToolUseBlock], turn_id: str, turn: int = 0
    ) -> tuple[list[ToolResultBlock], float, list[JSON]]:
        """The results in call order, the journaled time the last one was recorded, and what
        became of each call (for the session's events)."""
        self.turn = turn
        limit = self.run.behavior.max_concurrent_tools
        values: list[dict[str, Any]] = []
        for group in plan_groups(calls, self.tools, limit):
            gate = asyncio.Semaphore(limit) if len(group) > limit else None
            values.extend(await self._run_group(group, turn_id, gate))
        self.run.stats.tool_calls += len(values)
        results: list[ToolResultBlock] = []
        outcomes: list[JSON] = []
        for call, v in zip(calls, values, strict=True):
            is_error = bool(v["is_error"])
            results.append(tool_result(call["id"], v["content"], is_error=is_error))
            outcomes.append(
                {
                    "call_id": call["id"],
                    "tool": call["name"],
                    "outcome": v.get("outcome"),
                    "is_error": is_error,
                    "duration_s": v.get("duration_s"),
                }
            )
        return results, max([v["at"] for v in values]), outcomes

    async def _run_group(
        self, group: list[ToolUseBlock], turn_id: str, limit: asyncio.Semaphore | None
    ) -> list[dict[str, Any]]:
        durable = self.run.durable
        first = self.tools.get(group[0]["name"])
        if first is not None and first.self_journaled:
            return [await self._run_self_journaled(group[0], first, turn_id)]
        steps = [
            StepCall("tool", f"tool:{c['id']}", self._call_fn(c, turn_id, limit)) for c in group
        ]
        if any([self._needs_intent(c) for c in group]):

            async def interrupted(index: int) -> JSON:
                call = group[index]
                if not self._needs_intent(call):
                    return await steps[index].fn()  # replay="safe": simply run it again
                return await self._finish(call, turn_id, INTERRUPTED_RESULT, "interrupted", 0.0)

            values = await durable.guarded(f"tool-start:{group[0]['id']}", steps, interrupted)
        elif len(steps) == 1:
            values = [await durable.step(steps[0].kind, steps[0].name, steps[0].fn)]
        else:
            values = await durable.all(steps)
        return [dict(v) for v in values]

    def _needs_intent(self, call: ToolUseBlock) -> bool:
        tool = self.tools.get(call["name"])
        return tool is not None and tool.replay == "unsafe"

    def _context(self, call: ToolUseBlock, turn_id: str) -> ToolContext:
        run = self.run
        return ToolContext(
            call_id=call["id"],
            turn_id=turn_id,
            tool_name=call["name"],
            run_id=run.run_id,
            session_id=run.session_id,
            durable=run.durable.scope(f"tool:{call['id']}"),
            signal=run.abort.event,
            depth=run.agent.depth,
            agent=run.agent,
            run_stats=run.stats,
            extras=run.agent.tool_extras,
            record_decision=run.record_decision,
            budget_tree=run.budget_tree,
        )

    def _call_fn(
        self, call: ToolUseBlock, turn_id: str, limit: asyncio.Semaphore | None
    ) -> Callable[[], Any]:
        """The call's body: behind `limit` when its group has more calls than may run at once."""
        if limit is None:
            return lambda: self._invoke(call, turn_id)

        async def fn() -> JSON:
            async with limit:
                return await self._invoke(call, turn_id)

        return fn

    async def _check(self, call: ToolUseBlock, turn_id: str) -> dict[str, Any] | None:
        """Gate, lookup and validation: an error outcome, or None if the call may run."""
        hooks = self.run.agent.hooks
        name, arguments = call["name"], call["input"]
        if hooks.wants("tool:gate"):
            gate = await hooks.call(
                "tool:gate",
                {
                    "name": name,
                    "input": arguments,
                    "call_id": call["id"],
                    "turn_id": turn_id,
                    "block": False,
                    "reason": None,
                },
            )
            if gate["block"]:
                reason = gate["reason"] or "blocked by a tool:gate hook"
                return _outcome(f"Blocked: {reason}", outcome="blocked", is_error=True)
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            message = f"Unknown tool {name!r}. Available tools: {known}."
            await self._error_hook(call, turn_id, message)
            return _outcome(message, outcome="unknown", is_error=True)
        validator = self._validators.get(name)
        if validator is None:
            validator = self._validators[name] = validator_for(tool.spec.input_schema)
        problem = validator.error(arguments)
        if problem is not None:
            message = f"Invalid input for tool {name!r}: {problem}"
            await self._error_hook(call, turn_id, message)
            return _outcome(message, outcome="invalid", is_error=True)
        return None

    async def _invoke(self, call: ToolUseBlock, turn_id: str) -> dict[str, Any]:
        checked = await self._check(call, turn_id)
        if checked is not None:
            return checked
        tool = self.tools[call["name"]]
        return await self._finish(call, turn_id, *await self._execute(tool, call, turn_id))

    async def _execute(
        self,
        tool: ToolDef,
        call: ToolUseBlock,
        turn_id: str,
        ctx: ToolContext | None = None,
        started_at: float | None = None,
    ) -> tuple[ToolOutput, str, float]:
        """The output, its outcome and the seconds the body took. `started_at`: the journaled
        start of a self-journaled call (its `tool:before` fires on replays too)."""
        hooks = self.run.agent.hooks
        if hooks.wants("tool:before"):
            before = self._payload(
                call, turn_id, replay=tool.replay, self_journaled=tool.self_journaled
            )
            if started_at is not None:
                before["started_at"] = started_at
            await hooks.call("tool:before", before)
        self.run.live("tool_started", call_id=call["id"], tool=call["name"], input=call["input"])
        started = time.monotonic()
        try:
            if ctx is None and tool.uses_context:
                ctx = self._context(call, turn_id)
            # A tool that never reads its context gets none (`ToolDef.uses_context`).
            work = tool.execute(call["input"], cast(ToolContext, ctx))
            # A self-journaled tool may be parked: cutting it on a live abort would take a path
            # its replay cannot reproduce. It ends through its own journal (or a cancellation).
            output = await (work if tool.self_journaled else self.run.abort.race(work))
            outcome = "ok"
        except Aborted:
            output, outcome = ABORTED_RESULT, "aborted"
        except Exception as error:
            if self.run.durable.is_control_error(error):
                raise
            output = (
                f"Tool error: {error}"
                if isinstance(error, ToolError)
                else f"Tool error: {type(error).__name__}: {error}"
            )
            outcome = "error"
            await self._error_hook(call, turn_id, output)
        return output, outcome, time.monotonic() - started

    async def _finish(
        self, call: ToolUseBlock, turn_id: str, output: ToolOutput, outcome: str, duration: float
    ) -> dict[str, Any]:
        hooks = self.run.agent.hooks
        is_error = outcome != "ok"
        payload = None
        if hooks.wants("tool:transform") or hooks.wants("tool:after"):
            payload = await hooks.call(
                "tool:transform", self._payload(call, turn_id, result=output, is_error=is_error)
            )
            output, is_error = payload["result"], bool(payload["is_error"])
        result = cap_output(output, self.run.behavior.max_tool_result_bytes)
        if payload is not None:
            await hooks.call(
                "tool:after", dict(payload, result=result, outcome=outcome, duration_s=duration)
            )
        return _outcome(result, outcome=outcome, is_error=is_error, duration_s=duration)

    def _payload(self, call: ToolUseBlock, turn_id: str, **fields: Any) -> dict[str, Any]:
        """A hook's payload about `call`: the call, its turn and run, and `fields`."""
        return {
            "name": call["name"],
            "input": call["input"],
            "call_id": call["id"],
            "turn_id": turn_id,
            "run_id": self.run.run_id,
            "turn": self.turn,
            **fields,
        }

    async def _error_hook(self, call: ToolUseBlock, turn_id: str, message: str) -> None:
        await self.run.agent.hooks.call(
            "tool:error",
            {
                "name": call["name"],
                "input": call["input"],
                "call_id": call["id"],
                "turn_id": turn_id,
                "error": message,
            },
        )

    async def _run_self_journaled(
        self, call: ToolUseBlock, tool: ToolDef, turn_id: str
    ) -> dict[str, Any]:
        """A tool that journals its own steps: the checks are one decision step, the body runs
        outside any step so it can park or spawn through `ctx.durable`."""
        durable = self.run.durable

        async def check() -> JSON:
            return await self._check(call, turn_id) or {"allowed": True, "at": now_ms()}

        checked: dict[str, Any] = await durable.step("decision", f"tool-check:{call['id']}", check)
        if not checked.get("allowed"):
            return checked
        ctx = self._context(call, turn_id)
        run = self._execute(tool, call, turn_id, ctx, started_at=checked.get("at"))
        result = await self._finish(call, turn_id, *await run)
        result["at"] = await ctx.durable.now()  # the tool's own scope: its positions continue
        # Not journaled as a whole: what the session's events take from it must replay the same
        # (Restate compares a replayed state write with the journal), and a duration would not.
        result.pop("duration_s", None)
        return result
