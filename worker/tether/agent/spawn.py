"""In-process sub-agents: a `spawn` tool whose children journal into their own scopes.

A child runs in the parent's process and durable runtime, in the sub-journal of the call that
spawned it, so a replay of the parent replays the child too (no model or tool call repeated).
Its stats join the parent's (`AgentStats.children`), and it reserves its model calls from the
budget its parent reserves from (`tether.budget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from ..tools.toolset import Toolset

if TYPE_CHECKING:
    from ..providers.base import Provider
    from .behavior import Behavior
    from .stats import AgentStats

SPAWN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {"type": "string", "description": "What the sub-agent should do."},
        "system": {"type": "string", "description": "Optional system prompt for it."},
    },
    "required": ["task"],
}


def spawn_tool(
    *,
    name: str = "spawn",
    provider: Provider | None = None,
    tools: Sequence[ToolDef | Toolset] | None = None,
    system: str | None = None,
    behavior: Behavior | dict[str, Any] | None = None,
    max_depth: int = 2,
) -> ToolDef:
    """A tool that runs a task in a sub-agent and returns its final answer.

    By default the child has the parent's provider, tools (this one included, so children may
    spawn until `max_depth`) and system prompt.
    """
    from ..session.session import create_session
    from .agent import Agent

    async def execute(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        parent: Agent | None = ctx.agent
        if parent is None:
            raise ToolError("spawn needs the running agent in its context")
        if ctx.depth + 1 > max_depth:
            raise ToolError(f"sub-agents may nest at most {max_depth} deep; do the task yourself")
        child_behavior = parent.behavior.override(behavior)
        remaining = _remaining_budget(parent.behavior.max_cost_usd, ctx)
        if remaining is not None:
            child_behavior = child_behavior.override({"max_cost_usd": remaining})
        session = await create_session(id=ctx.durable.uuid(), clock=ctx.durable.now)
        # The parent's hooks may give the child hooks of its own (tracing: under this call).
        start = {"run_id": ctx.run_id, "call_id": ctx.call_id, "durable": ctx.durable}
        started = await parent.hooks.call("spawn:start", {**start, "hooks": {}})
        child = Agent(
            provider=provider or parent.provider,
            fallbacks=() if provider else parent.fallbacks,
            cooldown=None if provider else parent.cooldown,
            tools=parent.tools if tools is None else tools,
            system=arguments.get("system") or system or parent.system,
            durable=ctx.durable,
            session=session,
            behavior=child_behavior,
            hooks=started["hooks"],
            depth=ctx.depth + 1,
            tool_extras=parent.tool_extras,
            budget_tree=ctx.budget_tree,
        )
        live_before = ctx.durable.counters.live.total()
        stats = await child.run(arguments["task"])
        run_stats: AgentStats | None = ctx.run_stats
        if run_stats is not None:
            run_stats.children.append(stats)
        if ctx.durable.counters.live.total() > live_before:
            await parent.hooks.call("spawn:complete", {"call_id": ctx.call_id, "stats": stats})
        if stats.status != "completed":
            raise ToolError(f"the sub-agent stopped ({stats.status}): {stats.error or stats.text}")
        return stats.text or "(the sub-agent gave no answer)"

    return ToolDef(
        spec=ToolSpec(
            name=name,
            description="Hand a self-contained task to a sub-agent and get its final answer.",
            input_schema=SPAWN_SCHEMA,
        ),
        execute=execute,
        self_journaled=True,
    )


def _remaining_budget(limit: float | None, ctx: ToolContext) -> float | None:
    run_stats: AgentStats | None = ctx.run_stats
    if limit is None or run_stats is None:
        return None
    return max(limit - run_stats.total_cost_usd, 1e-9)
