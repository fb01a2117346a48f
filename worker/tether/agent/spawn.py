"""In-process sub-agents: a `spawn` tool whose children journal into their own scopes.

A child runs in the parent's process and durable runtime, in the sub-journal of the call that
spawned it, so a replay of the parent replays the child too (no model or tool call repeated).
Its stats join the parent's (`AgentStats.children`), and it reserves its model calls from the
budget its parent reserves from (`tether.budget`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from ..tools.toolset import Toolset

if TYPE_CHECKING:
    from ..providers.base import Fallback, Provider
    from .behavior import Behavior
    from .output import Output
    from .stats import AgentStats

SPAWN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "task": {"type": "string", "description": "What the sub-agent should do."},
        "system": {"type": "string", "description": "Optional system prompt for it."},
    },
    "required": ["task"],
}

AGENT_ARGUMENT = "agent"
"""The spawn tool's input naming the `Subagent` that runs its tasks."""


@dataclass(frozen=True)
class Subagent:
    """A sub-agent the spawn tool starts by name: a specialist with a prompt, tools, models and
    output of its own. What it leaves unset it has from the agent that spawns it. The model
    chooses one by its `description`."""

    name: str
    description: str
    system: str | None = None
    tools: tuple[str, ...] | None = None
    """The names of the spawning agent's tools it has (None: all of them). It may spawn in turn
    while the nesting allows, as any sub-agent."""
    provider: Provider | None = None
    fallbacks: tuple[Provider | Fallback, ...] = ()
    output: Output | None = None
    """The value it ends with (its answer to the spawn call is the value's JSON)."""
    behavior: dict[str, Any] | None = None
    """What of the spawning agent's behavior it changes (`Behavior.override`)."""

    def configure(
        self,
        *,
        provider: Provider,
        fallbacks: Sequence[Provider | Fallback],
        tools: Sequence[ToolDef | Toolset],
        system: str | None,
        behavior: Behavior,
        spawn: str,
    ) -> dict[str, Any]:
        """The keyword arguments of this sub-agent's `Agent`, given the spawning agent's own
        (`spawn`: the name of the spawn tool, which it keeps whatever its `tools`)."""
        kept = None if self.tools is None else {*self.tools, spawn}
        return {
            "provider": self.provider or provider,
            "fallbacks": self.fallbacks if self.provider else fallbacks,
            "tools": [t for t in tools if kept is None or t.name in kept],
            "system": self.system or system,
            "behavior": behavior.override(self.behavior),
            "output": self.output,
        }


def offering(
    schema: dict[str, Any], description: str, agents: Sequence[Subagent]
) -> tuple[dict[str, Any], str]:
    """A spawn tool's input schema and description with `agents` to choose from."""
    if not agents:
        return schema, description
    choice = {
        "type": "string",
        "enum": [a.name for a in agents],
        "description": "Which sub-agent does the tasks (unset: one like you, with your tools).",
    }
    listing = "\n".join(f"- {a.name}: {a.description}" for a in agents)
    properties = {**schema["properties"], AGENT_ARGUMENT: choice}
    return {**schema, "properties": properties}, f"{description}\nSub-agents (`agent`):\n{listing}"


def chosen(arguments: dict[str, Any], agents: Sequence[Subagent]) -> Subagent | None:
    """The sub-agent a spawn call names (None: a copy of the caller); a clear tool error for a
    name it does not have."""
    name = arguments.get(AGENT_ARGUMENT)
    if name is None:
        return None
    for agent in agents:
        if agent.name == name:
            return agent
    names = ", ".join(a.name for a in agents)
    raise ToolError(
        f"no sub-agent named {name!r}: choose one of {names}, or leave out `agent`"
        if names
        else "there are no named sub-agents: leave out `agent`"
    )


def spawn_tool(
    *,
    name: str = "spawn",
    provider: Provider | None = None,
    tools: Sequence[ToolDef | Toolset] | None = None,
    system: str | None = None,
    behavior: Behavior | dict[str, Any] | None = None,
    max_depth: int = 2,
    agents: Sequence[Subagent] = (),
) -> ToolDef:
    """A tool that runs a task in a sub-agent and returns its final answer.

    By default the child has the parent's provider, tools (this one included, so children may
    spawn until `max_depth`) and system prompt; a call may name one of `agents` instead.
    """
    from ..session.session import create_session
    from .agent import Agent

    async def execute(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        parent: Agent | None = ctx.agent
        if parent is None:
            raise ToolError("spawn needs the running agent in its context")
        if ctx.depth + 1 > max_depth:
            raise ToolError(f"sub-agents may nest at most {max_depth} deep; do the task yourself")
        kind = chosen(arguments, agents)
        child_behavior = parent.behavior.override(behavior)
        remaining = _remaining_budget(parent.behavior.max_cost_usd, ctx)
        if remaining is not None:
            child_behavior = child_behavior.override({"max_cost_usd": remaining})
        session = await create_session(id=ctx.durable.uuid(), clock=ctx.durable.now)
        # The parent's hooks may give the child hooks of its own (tracing: under this call).
        start = {"run_id": ctx.run_id, "call_id": ctx.call_id, "durable": ctx.durable}
        started = await parent.hooks.call("spawn:start", {**start, "hooks": {}})
        own: dict[str, Any] = {
            "provider": provider or parent.provider,
            "fallbacks": () if provider else parent.fallbacks,
            "tools": parent.tools if tools is None else tools,
            "system": arguments.get("system") or system or parent.system,
            "behavior": child_behavior,
        }
        if kind is not None:
            own = kind.configure(**own, spawn=name)
        child = Agent(
            **own,
            cooldown=None if provider else parent.cooldown,
            durable=ctx.durable,
            session=session,
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

    schema, description = offering(
        SPAWN_SCHEMA, "Hand a self-contained task to a sub-agent and get its final answer.", agents
    )
    return ToolDef(
        spec=ToolSpec(name=name, description=description, input_schema=schema),
        execute=execute,
        self_journaled=True,
    )


def _remaining_budget(limit: float | None, ctx: ToolContext) -> float | None:
    run_stats: AgentStats | None = ctx.run_stats
    if limit is None or run_stats is None:
        return None
    return max(limit - run_stats.total_cost_usd, 1e-9)
