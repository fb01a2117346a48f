"""The child side of a spawn: `run_child` runs a sub-agent in its own invocation.

The child handler calls `run_child`, which runs a sessionless agent on its own `restate_runtime`
and hands back the child's turns, stats and merged descendants (`ChildRunResult`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..agent.agent import Agent
from ..agent.behavior import Behavior
from ..agent.hooks import Hooks, HooksInit
from ..session.store import memory_store
from ..tools.base import ToolDef
from ..tools.toolset import Toolset
from .child_results import MERGED_CHILDREN_EXTRA, child_status, failed_result
from .runtime import RestateRuntime, restate_runtime
from .types import (
    ChildRunRequest,
    ChildRunResult,
    MergedChild,
    RestateContextLike,
    RestateRuntimeOptions,
)

if TYPE_CHECKING:
    from ..agent.output import Output
    from ..providers.base import Fallback, Provider
    from ..providers.cooldown import Cooldown

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
    fallbacks: Sequence[Provider | Fallback] = (),
    cooldown: Cooldown | None = None,
    tools: Sequence[ToolDef | Toolset] = (),
    system: str | None = None,
    behavior: Behavior | dict[str, Any] | None = None,
    output: Output | None = None,
    max_depth: int = 2,
    runtime_options: RestateRuntimeOptions | None = None,
    hooks: ChildHooks | None = None,
) -> ChildRunResult:
    """Run the child agent of `request` in the calling handler's invocation and return its
    `ChildRunResult`: status, final text, stats (descendants included), turns, and the
    descendants its own spawn tools merged (`children`), all replay-stable.

    Call it from the child service's handler. The agent runs on `restate_runtime(ctx)` without
    a session of its own (its turns go back to the parent in the result; with an `output`, its
    text is the value's JSON), at depth
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
        fallbacks=fallbacks,
        cooldown=cooldown,
        tools=tools,
        system=system,
        output=output,
        durable=durable,
        behavior=behavior,
        hooks=hooks(durable) if callable(hooks) else hooks,
        depth=request["depth"],
        tool_extras={MERGED_CHILDREN_EXTRA: merged},
        budget_tree=request.get("budget_tree"),
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
