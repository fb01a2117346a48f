"""Tool definitions: what the model sees (`ToolSpec`) and what runs (`ToolDef.execute`)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..errors import TetherError
from ..messages import ImageBlock, TextBlock

if TYPE_CHECKING:
    from ..durable.protocol import DurableRuntime

ToolOutput = str | list[TextBlock | ImageBlock]
ReplayPolicy = Literal["unsafe", "safe"]


@dataclass(frozen=True)
class ToolSpec:
    """The model-facing declaration of a tool."""

    name: str
    description: str
    input_schema: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )


@dataclass
class ToolContext:
    """What a running tool knows about the call and the run that made it."""

    call_id: str
    turn_id: str
    tool_name: str
    run_id: str
    session_id: str | None
    durable: DurableRuntime
    signal: asyncio.Event
    """Set when the run is aborted; long tools should watch it."""
    depth: int = 0
    """Sub-agent depth of the running agent (0 for the top level)."""
    agent: Any = None
    """The running agent, a `tether.agent.Agent` (what a spawn tool builds a child from). Typed
    loosely: tools sit below the agent, and a tool that uses it names the type itself."""
    run_stats: Any = None
    """The running run's `tether.agent.AgentStats` so far; a sub-agent's stats join its
    `children`."""
    extras: dict[str, Any] = field(default_factory=dict)
    """Host-provided values (a tool-state store, clients...)."""
    record_decision: Callable[[dict[str, Any]], Awaitable[None]] | None = None
    """Adds a person's decision on this call to the run's record in the session."""
    budget_tree: str | None = None
    """The budget the run reserves its model calls from (`tether.budget`); a sub-agent the tool
    starts reserves from it too."""

    @property
    def idempotency_key(self) -> str:
        """A key for the call's side effect, for APIs that act once per key (an
        `Idempotency-Key` header, Stripe's): the run and call ids are journaled, so every
        attempt of the call has the same, and every other call another. Hashed: the ids say
        nothing to the server."""
        return hashlib.sha256(f"{self.run_id}/{self.call_id}".encode()).hexdigest()[:32]


ToolExecute = Callable[[dict[str, Any], ToolContext], Awaitable[ToolOutput]]


@dataclass
class ToolDef:
    """A tool the agent can call.

    `replay="unsafe"` (the default) means a call that a crash cut off is reported to the model as
    interrupted instead of being run again; `"safe"` tools (idempotent reads) simply run again.
    `self_journaled` tools (awakeable waits, spawned sub-agents) journal their own steps through
    `ctx.durable`; the loop must not wrap them in a step of its own.
    """

    spec: ToolSpec
    execute: ToolExecute
    is_concurrency_safe: bool = False
    replay: ReplayPolicy = "unsafe"
    self_journaled: bool = False
    uses_context: bool = True
    """False: `execute` never reads its `ToolContext` (a `@tool` function without a parameter
    for it), so the loop does not build one for each call."""

    @property
    def name(self) -> str:
        return self.spec.name


class ToolError(TetherError):
    """Raise from a tool to return an error result to the model without a traceback."""
