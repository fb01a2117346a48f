"""`create_agent` and `Agent`: configuration plus the run entry point."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..durable.memory import memory_runtime
from ..durable.protocol import DurableRuntime
from ..errors import ConfigError, TetherError
from ..messages import JSON
from ..providers.base import Fallback, Provider
from ..providers.cooldown import Cooldown
from ..session.events import MemoryEventLog
from ..session.session import Session, create_session
from ..session.store import memory_store
from ..tools.base import ToolDef
from ..tools.human import Wait
from ..tools.toolset import Toolset
from .abort import AbortSignal
from .behavior import DEFAULT_BEHAVIOR, Behavior
from .hooks import Hooks, HooksInit
from .inbox import Inbox
from .loop import AgentRun
from .output import Output
from .stats import AgentStats


class AgentBusyError(TetherError, RuntimeError):
    """`run()` was called while the agent is already running."""


class Agent:
    """An agent: a provider, tools and a system prompt, run through a durable runtime."""

    def __init__(
        self,
        *,
        provider: Provider,
        fallbacks: Sequence[Provider | Fallback] = (),
        cooldown: Cooldown | None = None,
        tools: Sequence[ToolDef | Toolset] = (),
        system: str | None = None,
        output: Output | dict[str, Any] | None = None,
        durable: DurableRuntime | None = None,
        session: Session | None = None,
        behavior: Behavior | dict[str, Any] | None = None,
        hooks: Hooks | HooksInit | None = None,
        depth: int = 0,
        tool_extras: dict[str, Any] | None = None,
        inbox: Inbox | None = None,
        budget_tree: str | None = None,
        wait: Wait | None = None,
    ) -> None:
        names = [t.name for t in tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate tool names: {', '.join(duplicates)}")
        self.provider = provider
        self.fallbacks = tuple(f if isinstance(f, Fallback) else Fallback(f) for f in fallbacks)
        """The models that answer, in order, when the one before fails (`AgentRun`)."""
        self.cooldown = cooldown or (Cooldown() if self.fallbacks else None)
        """Which of the models to skip while they keep failing (one with fallbacks only)."""
        self.tools = list(tools)
        self.system = system
        self.output = Output(output) if isinstance(output, dict) else output
        """The value its runs end with (`AgentStats.output`); None: text."""
        self.durable: DurableRuntime = durable or memory_runtime()
        self.session = session
        self.behavior = DEFAULT_BEHAVIOR.override(behavior)
        self.hooks = hooks if isinstance(hooks, Hooks) else Hooks(hooks)
        self.depth = depth
        self.tool_extras = dict(tool_extras or {})
        self.inbox = inbox
        self.budget_tree = budget_tree
        """The budget this agent's runs reserve from (`tether.budget`): a sub-agent's is its
        root run's; None: a run with a budget of its own owns one."""
        self.wait = wait
        """How this agent's runs wait for a person outside a tool call: for more budget
        (`Behavior.on_budget_exhausted="ask"`). The runtime's, as its approval tools wait."""
        self._abort: AbortSignal | None = None
        self._running = False
        self.durable.on_live(self._replay_done)

    async def _replay_done(self) -> None:
        await self.hooks.call("replay:done", {})

    @property
    def running(self) -> bool:
        return self._running

    def abort(self) -> None:
        """Stop the running run at its next step boundary (or its in-flight model or tool
        call); the run ends with status `aborted`. A replaying run aborts at its first live
        step, so the journal is never forked mid-replay."""
        if self._abort is not None:
            self._abort.set()

    async def run(
        self,
        prompt: str | None = None,
        *,
        behavior: Behavior | dict[str, Any] | None = None,
        signal: asyncio.Event | None = None,
    ) -> AgentStats:
        """Run the loop until the model stops calling tools, or a limit or abort stops it.

        `prompt` may be omitted when the session already has turns (the run resumes from the
        last one). `signal`, when set, aborts the run like `abort()`.
        """
        if self._running:
            raise AgentBusyError("the agent is already running; await the current run first")
        self._running = True
        self._abort = AbortSignal()
        watcher = asyncio.ensure_future(self._watch(signal)) if signal else None
        try:
            session = await self._session()
            if prompt is None and not session.turn_count:
                raise ValueError("prompt is required when the session has no turns")
            run_behavior = self.behavior.override(behavior)
            self._check_can_ask(run_behavior)
            run = AgentRun(self, session, run_behavior, self._abort)
            stats = await run.execute(prompt)
            if stats.status == "aborted":
                await self.hooks.call("agent:abort", {"stats": stats})
            await self.hooks.call("agent:done", {"stats": stats})
            return stats
        finally:
            self._running = False
            if watcher:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher

    @property
    def is_sub_agent(self) -> bool:
        """A sub-agent's runs reserve from their root's budget and never ask for more."""
        return bool(self.depth or self.budget_tree)

    def _check_can_ask(self, behavior: Behavior) -> None:
        budgeted = behavior.max_cost_usd is not None or behavior.max_tokens is not None
        asks = behavior.on_budget_exhausted == "ask" and budgeted and not self.is_sub_agent
        if asks and self.wait is None:
            raise ConfigError(
                "Behavior.on_budget_exhausted='ask' needs the agent's `wait`, how its runs "
                "wait for a person (the runtime's: `tether run` and `tether worker` give it)"
            )

    async def events(self, after: str | None = None) -> AsyncIterator[JSON]:
        """Follow the session's event stream (`tether.session.events`) in process: every event
        after the cursor `after`, then each new one as the agent's runs go, until the caller
        stops iterating. Needs a runtime whose events live in process (memory, SQLite)."""
        session = await self._session()
        log = self.durable.stores.events
        if not isinstance(log, MemoryEventLog):
            raise TetherError(
                f"the {self.durable.backend} runtime keeps its events out of process: read them "
                "through the sidecar's GET /v1/sessions/<session>/events (`tether watch`)"
            )
        async for event in log.follow(session.id, after):
            yield event

    async def _watch(self, signal: asyncio.Event) -> None:
        await signal.wait()
        self.abort()

    async def _session(self) -> Session:
        if self.session is None:
            store = self.durable.stores.session or memory_store()
            self.session = await create_session(id=self.durable.uuid(), store=store)
        return self.session


def create_agent(
    *,
    provider: Provider,
    fallbacks: Sequence[Provider | Fallback] = (),
    cooldown: Cooldown | None = None,
    tools: Sequence[ToolDef | Toolset] = (),
    system: str | None = None,
    output: Output | dict[str, Any] | None = None,
    durable: DurableRuntime | None = None,
    session: Session | None = None,
    behavior: Behavior | dict[str, Any] | None = None,
    hooks: Hooks | HooksInit | None = None,
    inbox: Inbox | None = None,
    wait: Wait | None = None,
) -> Agent:
    """Build an agent. `tools` may hold toolsets (an MCP server's tools, `tether.tools.mcp`),
    which each run lists in a journaled step when it starts. `durable=None` runs on the
    in-memory runtime; `session=None` keeps the conversation in a session of the runtime's
    store; `inbox` lets messages reach it while it runs (`tether.agent.inbox`); `wait` is how
    a run waits for a person when its budget runs out (`Behavior.on_budget_exhausted`).
    `fallbacks` answer in order when `provider` fails: a model call that fails moves on to the
    next one at once, and a retryable failure of the last backs off and starts again from
    `provider`, as the journal records (a replay asks the same models). `cooldown` skips a
    model while it keeps failing (default with fallbacks: `Cooldown()`, this agent's own; share
    one among the agents of one list of models). `output` (an `Output`, or its JSON schema)
    makes a run end with a value of that schema (`AgentStats.output`), given as the input of
    a tool of its own."""
    return Agent(
        provider=provider,
        fallbacks=fallbacks,
        cooldown=cooldown,
        tools=tools,
        system=system,
        output=output,
        durable=durable,
        session=session,
        behavior=behavior,
        hooks=hooks,
        inbox=inbox,
        wait=wait,
    )
