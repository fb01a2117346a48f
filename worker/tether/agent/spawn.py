"""In-process sub-agents: a `spawn` tool whose children journal into their own scopes.

A child runs in the parent's process and durable runtime, in the sub-journal of the call that
spawned it, so a replay of the parent replays the child too (no model or tool call repeated).
Its stats join the parent's (`AgentStats.children`), and it reserves its model calls from the
budget its parent reserves from (`tether.budget`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from ..tools.toolset import Toolset

if TYPE_CHECKING:
    from ..durable.protocol import DurableRuntime
    from ..providers.base import Fallback, Provider
    from .behavior import Behavior
    from .output import Output
    from .stats import AgentStats

TASKS_SCHEMA: dict[str, Any] = {
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
"""The input of a spawn tool (`requested_tasks`), in process or on Restate."""
SPAWN_SCHEMA: dict[str, Any] = {
    **TASKS_SCHEMA,
    "properties": {
        **TASKS_SCHEMA["properties"],
        "system": {"type": "string", "description": "Optional system prompt for them."},
    },
}

SPAWN_DESCRIPTION = (
    "Hand self-contained tasks to sub-agents and get their final answers. Give `task` for one "
    "sub-agent, or `tasks` for several that run in parallel."
)

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
    max_concurrent: int | None = None,
    agents: Sequence[Subagent] = (),
) -> ToolDef:
    """A tool that runs a task in a sub-agent and returns its final answer.

    A call gives `task`, or `tasks` for several children that run at once, `max_concurrent` at
    a time (default: all), each in a journal scope of its own. By default a child has the
    parent's provider, tools (this one included, so children may spawn until `max_depth`) and
    system prompt; a call may name one of `agents` instead.
    """
    from ..session.session import create_session
    from .agent import Agent

    async def execute(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        parent: Agent | None = ctx.agent
        if parent is None:
            raise ToolError("spawn needs the running agent in its context")
        if ctx.depth + 1 > max_depth:
            raise ToolError(f"sub-agents may nest at most {max_depth} deep; do the task yourself")
        tasks = requested_tasks(arguments)
        kind = chosen(arguments, agents)
        child_behavior = parent.behavior.override(behavior)
        remaining = _remaining_budget(parent.behavior.max_cost_usd, ctx)
        if remaining is not None:
            child_behavior = child_behavior.override({"max_cost_usd": remaining})
        own: dict[str, Any] = {
            "provider": provider or parent.provider,
            "fallbacks": () if provider else parent.fallbacks,
            "tools": parent.tools if tools is None else tools,
            "system": arguments.get("system") or system or parent.system,
            "behavior": child_behavior,
        }
        if kind is not None:
            own = kind.configure(**own, spawn=name)
        slots = asyncio.Semaphore(max_concurrent or len(tasks))

        async def run_child(task: str, durable: DurableRuntime) -> AgentStats:
            async with slots:
                session = await create_session(id=durable.uuid(), clock=durable.now)
                # The parent's hooks may give the child hooks of its own (tracing: under the call).
                start = {"run_id": ctx.run_id, "call_id": ctx.call_id, "durable": durable}
                started = await parent.hooks.call("spawn:start", {**start, "hooks": {}})
                child = Agent(
                    **own,
                    cooldown=None if provider else parent.cooldown,
                    durable=durable,
                    session=session,
                    hooks=started["hooks"],
                    depth=ctx.depth + 1,
                    tool_extras=parent.tool_extras,
                    budget_tree=ctx.budget_tree,
                )
                return await child.run(task)

        live_before = ctx.durable.counters.live.total()
        # One task journals in the call's scope; several run at once, each in a scope of its own.
        scopes = (
            [ctx.durable]
            if len(tasks) == 1
            else [ctx.durable.scope(f"task:{i}") for i in range(len(tasks))]
        )
        results = await all_or_none(map(run_child, tasks, scopes))
        run_stats: AgentStats | None = ctx.run_stats
        if run_stats is not None:
            run_stats.children.extend(results)
        if ctx.durable.counters.live.total() > live_before:  # not a replay of the whole call
            for stats in results:
                await parent.hooks.call("spawn:complete", {"call_id": ctx.call_id, "stats": stats})
        labels = [f"child-{n}" for n in range(1, len(results) + 1)]
        return answers(labels, [(r.status, r.text, r.error) for r in results])

    schema, description = offering(SPAWN_SCHEMA, SPAWN_DESCRIPTION, agents)
    return ToolDef(
        spec=ToolSpec(name=name, description=description, input_schema=schema),
        execute=execute,
        self_journaled=True,
    )


async def all_or_none(children: Iterable[Awaitable[AgentStats]]) -> list[AgentStats]:
    """Each child's stats; when one raises (a park, a crash), the others are cancelled and
    waited for before its exception goes on as it is (their steps in flight run again)."""
    running = [asyncio.ensure_future(child) for child in children]
    try:
        return await asyncio.gather(*running)
    except BaseException:
        for child in running:
            child.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise


def requested_tasks(arguments: dict[str, Any]) -> list[str]:
    """The tasks of a spawn call: `task`, then `tasks`."""
    tasks = [str(t) for t in arguments.get("tasks") or []]
    if arguments.get("task"):
        tasks.insert(0, str(arguments["task"]))
    if not tasks:
        raise ToolError("give `task` (one sub-agent) or `tasks` (several)")
    return tasks


Outcome = tuple[str, str, "str | None"]
"""A child's status, final text and error."""


def answers(labels: Sequence[str], outcomes: Sequence[Outcome]) -> str:
    """The children's final answers, one labeled section each when several; any that did not
    complete makes it an error result."""
    failed = [status for status, _, _ in outcomes if status != "completed"]
    if len(outcomes) == 1:
        [(status, text, error)] = outcomes
        if failed:
            raise ToolError(f"the sub-agent stopped ({status}): {error or text}")
        return text or "(the sub-agent gave no answer)"
    sections = [
        f"[{label}] {text or '(no answer)'}"
        if status == "completed"
        else f"[{label}] stopped ({status}): {error or text}"
        for label, (status, text, error) in zip(labels, outcomes, strict=True)
    ]
    if failed:
        raise ToolError("\n\n".join(sections))
    return "\n\n".join(sections)


def _remaining_budget(limit: float | None, ctx: ToolContext) -> float | None:
    run_stats: AgentStats | None = ctx.run_stats
    if limit is None or run_stats is None:
        return None
    return max(limit - run_stats.total_cost_usd, 1e-9)
