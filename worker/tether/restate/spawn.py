"""`restate_spawn_tool`: the parent's side of sub-agents that run as separate Restate invocations.

The spawn tool builds a `ChildRunRequest` per task and hands it to `dispatch`, which starts the
child invocation (`ctx.service_call(child_handler, request)`) and returns the SDK's call future
untouched. The call is one journal entry of the parent; its result, the child's `ChildRunResult`
(`child_results`), is journaled by Restate, so a replay of the parent never runs a child again.
The child runs `run_child` (`child`); the parent merges what comes back (`merge`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, cast

import restate
from restate.context import RestateDurableFuture
from restate.exceptions import TerminalError

from ..agent.spawn import (
    SPAWN_DESCRIPTION,
    TASKS_SCHEMA,
    Subagent,
    answers,
    chosen,
    offering,
    requested_tasks,
)
from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from .awakeable_tool import maybe_await
from .child_results import child_result, failed_result
from .errors import is_restate_cancellation
from .merge import LabelCounters, Merge
from .runtime import RestateRuntime
from .types import (
    ChildRunRequest,
    ChildRunResult,
    ChildStatus,
    InFlightChild,
    RestateCombinators,
    RestateSpawnToolOptions,
)

log = logging.getLogger("tether.restate.spawn")


def child_request(
    task: str, label: str, depth: int, ctx: ToolContext, kind: Subagent | None = None
) -> ChildRunRequest:
    """What the child invocation gets: its task, label, depth, the parent's ids and the named
    sub-agent it is."""
    request: ChildRunRequest = {
        "task": task,
        "depth": depth,
        "label": label,
        "parent_call_id": ctx.call_id,
        "parent_run_id": ctx.run_id,
    }
    if kind is not None:
        request["subagent_type"] = kind.name
    if ctx.session_id is not None:
        request["session_id"] = ctx.session_id
    if ctx.budget_tree is not None:
        request["budget_tree"] = ctx.budget_tree
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
    ctx.durable.checkpoint()  # the children may take long: the parent's session shows them
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
    labels = LabelCounters()

    async def execute(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        tasks = requested_tasks(arguments)
        depth = ctx.depth + 1
        if depth > options.max_depth:
            raise ToolError(
                f"sub-agents may nest at most {options.max_depth} deep; do the task yourself"
            )
        kind = chosen(arguments, options.agents)
        merge = Merge(options, ctx, labels)
        requests = [child_request(t, labels.next(merge.session), depth, ctx, kind) for t in tasks]
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
        # The children's final texts (labeled when several); any failure is an error result.
        named = [r["label"] for r in requests]
        return answers(named, [(r["status"], r["text"], r.get("error")) for r in results])

    schema, description = offering(
        TASKS_SCHEMA, options.description or SPAWN_DESCRIPTION, options.agents
    )
    return ToolDef(
        spec=ToolSpec(name=options.name, description=description, input_schema=schema),
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
