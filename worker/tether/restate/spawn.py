"""`restate_spawn_tool` and `run_child`: sub-agents as separate Restate invocations.

The parent's spawn tool builds a `ChildRunRequest` per task and hands it to `dispatch`, which
starts the child invocation (`ctx.service_call(child_handler, request)`) and returns the SDK's
call future untouched. The call is one journal entry of the parent; its result, the child's
`ChildRunResult`, is journaled by Restate, so a replay of the parent never runs a child again.
The child handler calls `run_child`, which runs a sessionless agent on its own
`restate_runtime` and hands back the child's turns, stats and merged descendants.

Merging a child into the parent: its stats join the parent run's `children` (so the parent's
budgets count them), its run record (`SessionRun` with `parent_run_id` / `parent_call_id`) and
those of its descendants are saved in the parent's session, and `on_child_merged` receives the
subtree. The child's turns travel in the `MergedChild` records; they are not appended to the
parent's `session.turns`, because every turn there is part of the parent's conversation with
its model (a child's turns between a tool call and its result would break the transcript).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, cast, get_args

import restate
from restate.context import RestateDurableFuture
from restate.exceptions import TerminalError

from ..agent.agent import Agent
from ..agent.behavior import Behavior
from ..agent.hooks import Hooks, HooksInit
from ..agent.stats import AgentStats
from ..durable.ids import deterministic_uuid
from ..messages import JSON
from ..session.session import Session
from ..session.store import memory_store
from ..session.types import RunStatus, SessionRun
from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from .awakeable_tool import maybe_await
from .errors import is_restate_cancellation
from .runtime import RestateRuntime, restate_runtime
from .types import (
    ChildRunRequest,
    ChildRunResult,
    ChildStatus,
    InFlightChild,
    MergedChild,
    RestateCombinators,
    RestateContextLike,
    RestateRuntimeOptions,
    RestateSpawnToolOptions,
)

if TYPE_CHECKING:
    from ..providers.base import Provider

log = logging.getLogger("tether.restate.spawn")

MERGED_CHILDREN_EXTRA = "tether.restate.merged_children"
"""`ToolContext.extras` key of the list that collects `MergedChild` records. `run_child` sets
it, so a child's own spawn tool hands its merged descendants up without extra wiring."""

SPAWN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {"type": "string", "description": "What the sub-agent should do."},
        "tasks": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "description": "Several independent tasks, one sub-agent each, run in parallel.",
        },
    },
}

DEFAULT_DESCRIPTION = (
    "Hand self-contained tasks to sub-agents and get their final answers. Give `task` for one "
    "sub-agent, or `tasks` for several that run in parallel."
)

_RUN_STATUSES = frozenset(get_args(RunStatus))
_STATS_FIELDS = frozenset(f.name for f in dataclasses.fields(AgentStats))


# Labels ------------------------------------------------------------------------------------


class _LabelCounters:
    """`child-1`, `child-2`, ... per session. A counter starts after the child runs the session
    already holds, and the session is loaded from the journal at the start of every attempt, so
    a replay hands out the same labels in the same order."""

    def __init__(self) -> None:
        self._by_session: weakref.WeakKeyDictionary[Session, Iterator[int]] = (
            weakref.WeakKeyDictionary()
        )
        self._without_session = itertools.count(1)

    def next(self, session: Session | None) -> str:
        if session is None:
            return f"child-{next(self._without_session)}"
        counter = self._by_session.get(session)
        if counter is None:
            used = sum(1 for run in session.runs if run.parent_run_id is not None)
            counter = self._by_session[session] = itertools.count(used + 1)
        return f"child-{next(counter)}"


# Results -----------------------------------------------------------------------------------


def agent_stats(data: dict[str, Any]) -> AgentStats:
    """`AgentStats` from a child's JSON, ignoring fields this version does not know."""
    known = {k: v for k, v in data.items() if k in _STATS_FIELDS and k != "children"}
    children = [agent_stats(c) for c in data.get("children") or [] if isinstance(c, dict)]
    return AgentStats(**known, children=children)


def child_result(raw: Any) -> ChildRunResult:
    """The awaited call result as a `ChildRunResult` (a `generic_call` gives JSON bytes)."""
    value = json.loads(raw) if isinstance(raw, bytes | bytearray) else raw
    if not isinstance(value, dict) or "status" not in value:
        return failed_result(f"the child returned {type(value).__name__}, not a ChildRunResult")
    value.setdefault("text", "")
    value.setdefault("stats", {})
    value.setdefault("turns", [])
    return cast(ChildRunResult, value)


def failed_result(error: str, status: ChildStatus = "error") -> ChildRunResult:
    """The result of a child that never produced one (refused, failed invocation)."""
    stats = AgentStats(status="aborted" if status == "aborted" else "error", error=error)
    return {"status": status, "text": "", "stats": stats.to_json(), "turns": [], "error": error}


def child_status(stats: AgentStats) -> tuple[ChildStatus, str | None]:
    """How a child run ended, as a `ChildStatus` and an error detail."""
    if stats.status in ("completed", "aborted"):
        return stats.status, stats.error
    return "error", stats.error or f"the sub-agent stopped: {stats.status}"


def run_status(node: MergedChild) -> RunStatus:
    """The session status of a merged run: the child's own run status when it has one."""
    status = node["stats"].get("status")
    if status in _RUN_STATUSES:
        return cast(RunStatus, status)
    return "completed" if node["status"] == "completed" else "error"


# Merging -----------------------------------------------------------------------------------


class Merge:
    """Merges the children of one spawn call into the parent run and session."""

    def __init__(
        self, options: RestateSpawnToolOptions, ctx: ToolContext, labels: _LabelCounters
    ) -> None:
        self.options = options
        self.ctx = ctx
        self.labels = labels
        agent: Agent | None = ctx.agent
        self.session = agent.session if agent is not None else None

    def node(self, label: str, task: str, result: ChildRunResult) -> MergedChild:
        """A merged record of a direct child (relative depth 1) with its relabeled subtree."""
        node: MergedChild = {
            "label": label,
            "task": task,
            "depth": 1,
            "status": result["status"],
            "stats": result["stats"],
            "turns": result["turns"],
        }
        if "started_at" in result:
            node["started_at"] = result["started_at"]
        if "ended_at" in result:
            node["ended_at"] = result["ended_at"]
        below = [self.relabel(c, 2) for c in result.get("children") or []]
        if below:
            node["children"] = below
        return node

    def relabel(self, child: MergedChild, depth: int) -> MergedChild:
        """A descendant's record, labeled from this session's counter at this level's depth."""
        node: MergedChild = {
            **child,
            "label": self.labels.next(self.session),
            "depth": depth,
        }
        below = [self.relabel(c, depth + 1) for c in child.get("children") or []]
        if below:
            node["children"] = below
        else:
            node.pop("children", None)
        return node

    def run_id(self, node: MergedChild) -> str:
        """The child's own run id, else one derived from this call and the node's label."""
        given = node["stats"].get("run_id")
        if isinstance(given, str) and given:
            return given
        return deterministic_uuid(f"{self.ctx.run_id}:{self.ctx.call_id}:{node['label']}")

    def session_run(
        self, node: MergedChild, parent_run_id: str, parent_call_id: str | None
    ) -> SessionRun:
        """The run record of `node`. Times come from the child's clock (replay-stable: they
        arrived in the journaled call result), else its turns, else this run's start."""
        turns = node["turns"]
        run_stats: AgentStats | None = self.ctx.run_stats
        fallback = run_stats.started_at if run_stats else None
        started = node.get("started_at") or node["stats"].get("started_at")
        ended = node.get("ended_at") or node["stats"].get("ended_at")
        if started is None:
            started = turns[0]["created_at"] if turns else fallback or 0.0
        if ended is None and turns:
            ended = turns[-1]["created_at"]
        return SessionRun(
            id=self.run_id(node),
            status=run_status(node),
            started_at=float(started),
            ended_at=None if ended is None else float(ended),
            prompt=node["task"],
            stats=node["stats"],
            parent_run_id=parent_run_id,
            parent_call_id=parent_call_id,
        )

    async def persist(
        self, node: MergedChild, parent_run_id: str, parent_call_id: str | None
    ) -> None:
        """Save the run records of `node` and its descendants in the parent's session."""
        assert self.session is not None
        await self.session.save_run(self.session_run(node, parent_run_id, parent_call_id))
        for child in node.get("children") or []:
            await self.persist(child, self.run_id(node), None)

    async def merge(self, node: MergedChild) -> AgentStats:
        """Persist, count and hand up one direct child's subtree; returns its stats."""
        ctx = self.ctx
        if self.options.persist and self.session is not None:
            await self.persist(node, ctx.run_id, ctx.call_id)
        stats = agent_stats(node["stats"])
        run_stats: AgentStats | None = ctx.run_stats
        if run_stats is not None:
            run_stats.children.append(stats)
        collector = ctx.extras.get(MERGED_CHILDREN_EXTRA)
        if isinstance(collector, list):
            collector.append(node)
        if self.options.on_child_merged is not None:
            self.options.on_child_merged(node, ctx)
        return stats

    async def announce(self, children: list[AgentStats]) -> None:
        """`spawn:complete` per child, from one journaled step: it fires in the attempt that
        first gets past the children, and never again on a replay (a child's result is often
        first seen by a replay that resumed a suspended parent, so "the call ran live" cannot
        be told apart from the call's own journal entry). Besides `call_id` and the child's
        `stats`, the payload has the child's `index` in the call and the call's `fanout`."""
        agent: Agent | None = self.ctx.agent
        if agent is None:
            return
        hooks = agent.hooks

        async def fire() -> JSON:
            for index, stats in enumerate(children):
                payload = {
                    "call_id": self.ctx.call_id,
                    "stats": stats,
                    "index": index,
                    "fanout": len(children),
                }
                await hooks.call("spawn:complete", payload)
            return len(children)

        await self.ctx.durable.step("decision", "spawn:complete", fire)


# The tool ----------------------------------------------------------------------------------


def requested_tasks(arguments: dict[str, Any]) -> list[str]:
    """The tasks of a spawn call: `task`, then `tasks`."""
    tasks = [str(t) for t in arguments.get("tasks") or []]
    if arguments.get("task"):
        tasks.insert(0, str(arguments["task"]))
    if not tasks:
        raise ToolError("give `task` (one sub-agent) or `tasks` (several)")
    return tasks


def child_request(task: str, label: str, depth: int, ctx: ToolContext) -> ChildRunRequest:
    """What the child invocation gets: its task, label, depth and the parent's ids."""
    request: ChildRunRequest = {
        "task": task,
        "depth": depth,
        "label": label,
        "parent_call_id": ctx.call_id,
        "parent_run_id": ctx.run_id,
    }
    if ctx.session_id is not None:
        request["session_id"] = ctx.session_id
    return request


def combinators(ctx: ToolContext) -> RestateCombinators:
    """The runtime's combinators, else the SDK's."""
    durable = ctx.durable
    if isinstance(durable, RestateRuntime) and durable.promises is not None:
        return durable.promises
    return cast(RestateCombinators, restate)


async def settle(futures: Sequence[Any], ctx: ToolContext) -> list[ChildRunResult]:
    """Wait for every child, then read each outcome. Waiting through the SDK's `gather` first
    separates the parent's own cancellation (raised by the wait) from a child's failure
    (raised when its result is read), which becomes that child's error result."""
    if all(isinstance(f, RestateDurableFuture) for f in futures):
        await combinators(ctx).gather(*futures)
    results: list[ChildRunResult] = []
    for future in futures:
        try:
            results.append(child_result(await future))
        except TerminalError as error:
            status: ChildStatus = "aborted" if is_restate_cancellation(error) else "error"
            results.append(failed_result(f"the child invocation failed: {error}", status))
    return results


def tool_output(labels: list[str], results: list[ChildRunResult]) -> ToolOutput:
    """The child's final text; several children are labeled. Any failure is an error result."""
    failed = [r for r in results if r["status"] != "completed"]
    if len(results) == 1:
        result = results[0]
        if failed:
            detail = result.get("error") or result["text"]
            raise ToolError(f"the sub-agent stopped ({result['status']}): {detail}")
        return result["text"] or "(the sub-agent gave no answer)"
    sections = []
    for label, result in zip(labels, results, strict=True):
        if result["status"] == "completed":
            sections.append(f"[{label}] {result['text'] or '(no answer)'}")
        else:
            detail = result.get("error") or result["text"]
            sections.append(f"[{label}] stopped ({result['status']}): {detail}")
    text = "\n\n".join(sections)
    if failed:
        raise ToolError(text)
    return text


def waves(requests: list[ChildRunRequest], size: int | None) -> list[list[ChildRunRequest]]:
    """`requests` in dispatch order, `size` at a time (all at once without a size)."""
    if not size or size >= len(requests):
        return [requests]
    return [requests[i : i + size] for i in range(0, len(requests), size)]


def restate_spawn_tool(options: RestateSpawnToolOptions) -> ToolDef:
    """A `spawn` tool whose children run as separate Restate invocations.

    Per call: one `ChildRunRequest` per task (`task`, or `tasks` for a parallel fan-out), with
    a label from the parent session's counter (`child-1`, `child-2`...; replay-stable), the
    child's depth (the caller's + 1; deeper than `max_depth` is refused before dispatch) and
    the parent's run, call and session ids. `options.dispatch(request, tool_ctx)` starts each
    child and returns the SDK call future untouched; the tool joins them with the runtime's
    combinator (`gather`). With `max_concurrent`, the children start in waves of that many, in
    task order, each wave after the previous one settled (a replay takes the same waves).
    Each settled child is merged: its stats join the parent run's
    `children` (budgets count them), its run record and its descendants' (`MergedChild`,
    relabeled, depth relative to this run) are saved in the parent's session when `persist`,
    `on_child_merged` gets the subtree, and `spawn:complete` fires once per child (from one
    journaled step per call, so never again on a replay).

    The result is the child's final text (several children: one labeled section each); a
    child that did not complete makes it an error result. When the run's abort signal stops
    the call while children are in flight, `on_abort(in_flight, tool_ctx)` runs once (cancel
    the parent's own invocation there to cancel the whole tree; drive it through
    `replay_aware_abort`). A Restate cancellation of the parent propagates unchanged.
    """
    labels = _LabelCounters()

    async def execute(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        tasks = requested_tasks(arguments)
        depth = ctx.depth + 1
        if depth > options.max_depth:
            raise ToolError(
                f"sub-agents may nest at most {options.max_depth} deep; do the task yourself"
            )
        merge = Merge(options, ctx, labels)
        requests = [child_request(t, labels.next(merge.session), depth, ctx) for t in tasks]
        results: list[ChildRunResult] = []
        for wave in waves(requests, options.max_concurrent):
            futures = [options.dispatch(request, ctx) for request in wave]
            try:
                results.extend(await settle(futures, ctx))
            except asyncio.CancelledError:
                await abort_children(options, wave, ctx)
                raise
        merged = [
            await merge.merge(merge.node(request["label"], request["task"], result))
            for request, result in zip(requests, results, strict=True)
        ]
        await merge.announce(merged)
        return tool_output([r["label"] for r in requests], results)

    return ToolDef(
        spec=ToolSpec(
            name=options.name,
            description=options.description or DEFAULT_DESCRIPTION,
            input_schema=SPAWN_SCHEMA,
        ),
        execute=execute,
        self_journaled=True,
    )


async def abort_children(
    options: RestateSpawnToolOptions, requests: list[ChildRunRequest], ctx: ToolContext
) -> None:
    """`on_abort` when the run's abort signal cancelled the wait for the children."""
    if options.on_abort is None or not ctx.signal.is_set():
        return
    in_flight: list[InFlightChild] = [
        {"label": r["label"], "task": r["task"], "depth": r["depth"]} for r in requests
    ]
    try:
        await maybe_await(options.on_abort(in_flight, ctx))
    except Exception:
        log.exception("on_abort of spawn call %s failed", ctx.call_id)


# The child side ----------------------------------------------------------------------------

ChildHooks = Hooks | HooksInit | Callable[[RestateRuntime], Hooks | HooksInit]
"""The hooks of a child agent, or a function of the child's runtime that builds them."""


def refused(request: ChildRunRequest, max_depth: int) -> ChildRunResult:
    """The result of a child asked to run deeper than allowed."""
    return failed_result(
        f"refused: sub-agent depth {request['depth']} is over the limit of {max_depth}"
    )


async def run_child(
    ctx: RestateContextLike,
    request: ChildRunRequest,
    *,
    provider: Provider,
    tools: Sequence[ToolDef] = (),
    system: str | None = None,
    behavior: Behavior | dict[str, Any] | None = None,
    max_depth: int = 2,
    runtime_options: RestateRuntimeOptions | None = None,
    hooks: ChildHooks | None = None,
) -> ChildRunResult:
    """Run the child agent of `request` in the calling handler's invocation and return its
    `ChildRunResult`: status, final text, stats (descendants included), turns, and the
    descendants its own spawn tools merged (`children`), all replay-stable.

    Call it from the child service's handler. The agent runs on `restate_runtime(ctx)` without
    a session of its own (its turns go back to the parent in the result), at depth
    `request["depth"]`; a depth over `max_depth` is refused with an error result. A
    `restate_spawn_tool` among `tools` dispatches grandchildren; their merged records are
    collected automatically. `hooks` are the child agent's hooks, or a function of the child's
    runtime that builds them (for hooks that read it, like `tether.programs.metrics.agent_hooks`).
    """
    if request["depth"] > max_depth:
        return refused(request, max_depth)
    settings = runtime_options or RestateRuntimeOptions()
    if settings.session_store is None:
        settings = dataclasses.replace(settings, session_store=memory_store())
    merged: list[MergedChild] = []
    durable = restate_runtime(ctx, settings)
    agent = Agent(
        provider=provider,
        tools=tools,
        system=system,
        durable=durable,
        behavior=behavior,
        hooks=hooks(durable) if callable(hooks) else hooks,
        depth=request["depth"],
        tool_extras={MERGED_CHILDREN_EXTRA: merged},
    )
    stats = await agent.run(request["task"])
    status, error = child_status(stats)
    turns = [t.to_json() for t in agent.session.turns] if agent.session else []
    result: ChildRunResult = {
        "status": status,
        "text": stats.text,
        "stats": stats.to_json(),
        "turns": turns,
    }
    if merged:
        result["children"] = merged
    if error:
        result["error"] = error
    if stats.started_at is not None:
        result["started_at"] = stats.started_at
    if stats.ended_at is not None:
        result["ended_at"] = stats.ended_at
    return result
