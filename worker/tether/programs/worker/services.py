"""The agent's runs as Restate services: a virtual object per session, keyed by session id.

`<agent>/<session>/run` (exclusive) runs the agent on `restate_runtime` with the session in the
object's state; `session` and `pending` (shared) read it while a run is going on. This is what
`tether worker --serve agent` serves (`agent_services`). What the runs of every version share
they reach by service name, through Restate, served wherever `--serve index` runs (`served`: in
the sidecar's pods, or in this same worker with `--serve all`, the default): the agent's index
`<agent>-parked`, where a run adds the calls it parks (`parked_index`); `<agent>-live`, where it
posts its live events (`live`); `<agent>-inbox/<session>`, whose `post` leaves a message the run
takes at its next turn (`inbox`); and with sub-agents and a budget, `<agent>-budget/<root run>`,
the ledger a run and all its sub-agents reserve their model calls from
(`tether.restate.budget`).

With `spec.subagents`, the agent has a `spawn` tool (`restate_spawn_tool`). Each child is an
invocation of the exclusive `child` handler of the same object, keyed `<parent key>::<label>`
(`s1::child-1`, its own children `s1::child-1::child-1`, ...), which runs `run_child` with the
agent's provider, tools, system prompt and behavior. So a child can park on an approval or
`ask_human` like the agent itself, and its parked record lives under the agent's service name,
where the sidecar finds it. Children spawn in turn while they are shallower than `maxDepth`;
one spawn call runs at most `maxConcurrent` children at once (in waves, in task order).

While a run has children, each has a marker `tether:child:<key>` in the spawner's state (cleared
when the run ends), so `pending` of a session lists the calls its children (and theirs) parked.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, cast

import restate
from pydantic import BaseModel, Field
from restate.exceptions import TerminalError

from ...agent import AgentStats, create_agent
from ...agent.compaction import ContextCovered
from ...agent.hooks import HookFn
from ...durable.protocol import DurableRuntime
from ...parked import PARKED_STATE_KEY, ParkedCall
from ...providers.base import Fallback, Provider
from ...providers.pace import Pacer
from ...rate import Pace
from ...restate import (
    ChildRunRequest,
    RestateRuntimeOptions,
    RestateSpawnToolOptions,
    restate_runtime,
    restate_session_store,
    restate_spawn_tool,
    run_child,
)
from ...restate.budget import budget_object
from ...restate.child_results import failed_result
from ...restate.errors import WorkerStopping
from ...restate.events import read_events
from ...session import Session, SessionStore, SessionTurn, create_session, load_session
from ...session.events import Cursor
from ...session.fork import ForkError, fork_session
from ...session.store import every_turn
from ...spec import EventsSpec, ModelChoice, parse_duration
from ...spec.assemble import (
    SPAWN_TOOL,
    PacerOf,
    SpecTools,
    behavior_from_spec,
    check_subagents,
    cooldown_from_spec,
    fallbacks_from_spec,
    local_pacer,
    local_spend_gate,
    output_from_spec,
    parking_with,
    provider_from_spec,
    require_api_key,
    subagents_from_spec,
)
from ...spec.stopping import LONGEST_STEP_SECONDS
from ...tools.base import ToolContext, ToolDef
from ...tools.human import Wait
from ...tools.toolset import Toolset
from ..metrics import (
    agent_hooks,
    agent_series_at_zero,
    count_run_that_left,
    mcp_observer,
    watch_waiting_calls,
)
from ..trace_context import TRACEPARENT_KEY, TraceParent, child_traceparent, traces_wanted
from . import stopping
from .handoff_client import RestateHandoff
from .inbox import RestateInbox, inbox_object
from .ingress import IngressPoster
from .live import LivePublisher
from .pace_client import RestatePacer
from .parked_index import ParkedIndex
from .parking import ParkSettings, restate_wait
from .retries import RETRY_AFTER_WORKER_LOSS
from .served import shares_a_budget
from .settings import WorkerSettings
from .spend_client import RestateSpendGate

PARK_AFTER = timedelta(seconds=10)
"""A run waiting on a person (or a timer) suspends after this long without journal progress, so
parked runs hold no worker; a step that is still running is not cut by it."""
LONGEST_STEP = timedelta(seconds=LONGEST_STEP_SECONDS)
"""After the suspension request, how long a running step (a long model stream) may still take
before Restate aborts the attempt and retries it."""

log = logging.getLogger(__name__)

CHILD_MARKER = "tether:child:"
"""State key prefix of the markers a run leaves for the children it started."""

RUN_IDEMPOTENCY_RETENTION = timedelta(days=1)
"""How long Restate keeps the idempotency key of a run after it ended (set here, so a server's
lower default cannot shorten it): the sidecar starts runs from signed webhooks under a key, and
a replay of one is refused only while its key is kept. A signature is accepted for 10 minutes
(`tether.programs.webhooks.TOLERANCE_SECONDS` either side of its timestamp)."""


class ForkRequest(BaseModel):
    """The session a new one starts as a fork of."""

    session: str = Field(min_length=1, description="The session to fork; it stays as it is.")
    turns: int | None = Field(
        default=None, gt=0, description="Its first turns to keep, ending with an answer (all)."
    )


class RunRequest(BaseModel):
    """Start or continue the session's conversation."""

    prompt: str | None = Field(
        default=None, description="The task; may be omitted when the session already has turns."
    )
    fork: ForkRequest | None = Field(
        default=None,
        description="Start this new session as a fork of another: its first turns, then the run.",
    )
    start_by: float | None = Field(
        default=None,
        description="Skip the run when it cannot start by this time (epoch seconds): a "
        "schedule's run waiting behind its session's runs past the schedule's next time.",
    )


class RunResult(BaseModel):
    """How the run ended."""

    run_id: str | None
    status: str
    text: str
    turns: int
    tool_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    error: str | None = None
    output: Any = None
    """The value the run ended with (`spec.output`)."""

    @classmethod
    def skipped(cls) -> RunResult:
        return cls(
            run_id=None,
            status="skipped",
            text="",
            turns=0,
            tool_calls=0,
            input_tokens=0,
            output_tokens=0,
            cost_usd=0.0,
        )

    @classmethod
    def of(cls, stats: AgentStats) -> RunResult:
        return cls(
            run_id=stats.run_id,
            status=stats.status,
            text=stats.text,
            turns=stats.turns,
            tool_calls=stats.tool_calls,
            input_tokens=stats.input_tokens,
            output_tokens=stats.output_tokens,
            cost_usd=stats.total_cost_usd,
            error=stats.error,
            output=stats.output,
        )


def child_key(parent_key: str, label: str) -> str:
    """The object key of a child: its parent's key and the label the parent gave it."""
    return f"{parent_key}::{label}"


async def forget_children(ctx: restate.ObjectContext) -> None:
    """Clear the markers of the children a finished run started (they finished before it)."""
    for key in await ctx.state_keys():
        if key.startswith(CHILD_MARKER):
            ctx.clear(key)


async def fork_into(
    ctx: restate.ObjectContext,
    agent: str,
    store: SessionStore,
    fork: ForkRequest,
    existing: Session | None,
) -> Session:
    """This new session as a fork of `fork.session`, whose turns its `session` handler gives
    (a journaled call: a retry of the run forks the same turns)."""
    if existing is not None:
        raise TerminalError(f"session {ctx.key()!r} exists: fork into a new session", 409)
    raw = await ctx.generic_call(agent, "session", b"null", key=fork.session)
    source = json.loads(raw)
    if not source["turns"]:
        raise TerminalError(f"no session {fork.session!r} to fork", 404)
    turns = [SessionTurn.from_json(turn) for turn in source["turns"]]
    try:
        return await fork_session(fork.session, turns, id=ctx.key(), store=store, count=fork.turns)
    except ForkError as error:
        raise TerminalError(str(error), 400) from None


@contextlib.contextmanager
def counting_leaves(agent: str) -> Iterator[None]:
    """Counts a run that leaves its stopping worker (`WorkerStopping` goes on up)."""
    try:
        yield
    except WorkerStopping:
        count_run_that_left(agent)
        raise


def build_models(settings: WorkerSettings) -> tuple[Provider, list[Fallback]]:
    """The spec's model and its fallbacks, with their keys (a clear error for one not set),
    each with a rate limit paced across the agent's workers, and all held to the agent's spend
    caps across them (through Restate's ingress; a worker without one, or without a secret to
    sign with, paces and counts its own calls)."""
    spec, env = settings.manifest.spec, dict(settings.env)
    pacer_of: PacerOf = local_pacer
    spend = local_spend_gate(spec)
    if settings.ingress_url and settings.webhook_secret:
        ingress, secret = IngressPoster(settings.ingress_url, timeout=5.0), settings.webhook_secret

        def across_workers(model: ModelChoice, pace: Pace) -> Pacer:
            return RestatePacer(settings.agent_name, model.label, pace, ingress, secret)

        pacer_of = across_workers
        if spend is not None:
            spend = RestateSpendGate(settings.agent_name, spend.caps, ingress, secret)
    provider = provider_from_spec(spec, require_api_key(spec, env), pacer_of, spend)
    return provider, fallbacks_from_spec(spec, env, pacer_of, spend)


def agent_services(settings: WorkerSettings) -> list[restate.VirtualObject]:
    """The agent's virtual object, named after the agent. Not what the runs of every version
    share (`served.index_services`: the index of parked calls, the live events, the inboxes,
    the budget ledgers), which the runs reach by name."""
    manifest = settings.manifest
    spec = manifest.spec
    check_subagents(spec)
    provider, fallbacks = build_models(settings)
    behavior = behavior_from_spec(spec)
    compacted = behavior.compact_strategy == "tail"
    subagents = spec.subagents
    approvals = spec.approvals
    kept = spec.events or EventsSpec()
    # Sent to by name, served where `--serve index` runs (`served`).
    index = ParkedIndex(manifest.metadata.name, settings.webhook_secrets)
    park_settings = ParkSettings(
        agent=manifest.metadata.name,
        timeout_seconds=parse_duration(approvals.timeout),
        notify_url=settings.notify_url,
        webhook_secret=settings.webhook_secret,
        webhook_base_url=settings.webhook_base_url,
        recipients=tuple((approvals.notify.recipients or []) if approvals.notify else []),
        index=index,
        notify_format=(approvals.notify.format if approvals.notify else None) or "json",
    )
    _, take_messages = inbox_object(manifest.metadata.name)  # served with the index
    live = LivePublisher(
        manifest.metadata.name,
        settings.ingress_url or "",
        settings.webhook_secret,
        watch_secrets=settings.webhook_secrets,
    )
    live_sink = live if settings.ingress_url else None
    # Signed like the live events: without a secret (or an ingress), bodies stay in-process.
    handoff = (
        RestateHandoff(manifest.metadata.name, settings.ingress_url, settings.webhook_secret)
        if settings.ingress_url and settings.webhook_secret
        else None
    )
    observe_mcp = mcp_observer(manifest.metadata.name)
    budgeted = shares_a_budget(spec)
    # The ledgers are served with the index (`served`): here only the calls to them.
    _, ledger_for = budget_object(manifest.metadata.name, None)
    models = [provider, *(f.provider for f in fallbacks)]
    agent_series_at_zero(manifest.metadata.name, models=[(m.name, m.model) for m in models])
    watch_waiting_calls(manifest.metadata.name, models)
    window = max(m.context_window for m in models)  # whichever model a run asks
    cooldown = cooldown_from_spec(spec)  # what the worker's runs learn of their models, shared
    output = output_from_spec(spec)
    named = {agent.name: agent for agent in subagents_from_spec(spec, provider, fallbacks)}
    obj = restate.VirtualObject(
        manifest.metadata.name,
        description=f"The {manifest.metadata.name} agent; the object key is the session id.",
        inactivity_timeout=PARK_AFTER,
        abort_timeout=LONGEST_STEP,
        invocation_retry_policy=RETRY_AFTER_WORKER_LOSS,
    )

    spec_tools = SpecTools(spec, settings.workspace, env=settings.env, observe=observe_mcp)

    def tools_for(ctx: restate.ObjectContext, wait: Wait) -> list[ToolDef | Toolset]:
        return spec_tools.for_run(parking_with(wait, approvals.on_timeout))

    tracing = None
    if traces_wanted(settings.env):  # OTEL_EXPORTER_OTLP_ENDPOINT...; else no cost at all
        from ..tracing import tracing_from_env

        tracing = tracing_from_env(settings.env, service_name=manifest.metadata.name)

    def hooks_for(
        durable: DurableRuntime,
        trace: TraceParent | None = None,
        session_id: str | None = None,
        subagent: str | None = None,
    ) -> dict[str, list[HookFn]]:
        """The metrics hooks of a run (the session's agent or a child, of the named sub-agent
        `subagent`) on `durable`, and its tracing hooks when traces are exported (a child's run
        under `trace`, its spawn call)."""
        name = manifest.metadata.name
        hooks = agent_hooks(name, provider=provider.name, model=provider.model, durable=durable)
        merged = {hook: [fn] for hook, fn in hooks.items()}
        if tracing is not None:
            attributes = {"gen_ai.conversation.id": session_id} if session_id else {}
            if subagent is not None:
                attributes["tether.subagent"] = subagent
            traced = tracing.hooks(
                agent=name,
                provider=provider.name,
                model=provider.model,
                durable=durable,
                parent=trace,
                attributes=attributes,
            )
            for hook, fn in traced.items():
                merged.setdefault(hook, []).append(fn)
        return merged

    def spawn_for(
        ctx: restate.ObjectContext,
        depth: int,
        trace: TraceParent | None = None,
        allowed: list[str] | None = None,
    ) -> list[ToolDef]:
        """The spawn tool of the agent at `depth` (0: the session's), while it may spawn; the
        run it belongs to is under `trace` (a child's) or a trace of its own, and its children
        get at most the tools `allowed` (None: the agent's)."""
        if subagents is None or depth >= subagents.max_depth:
            return []

        def dispatch(request: ChildRunRequest, tool_ctx: ToolContext) -> Any:
            key = child_key(ctx.key(), request["label"])
            ctx.set(CHILD_MARKER + key, True)  # `pending` looks there while the run goes on
            # Derived from the ids, tracing or not: the journaled call is the same either way.
            parent = child_traceparent(trace, tool_ctx.run_id, tool_ctx.call_id)
            arg = {**request, TRACEPARENT_KEY: parent}
            if allowed is not None:
                arg["allowed_tools"] = allowed
            return ctx.object_call(child, key=key, arg=arg)

        options = RestateSpawnToolOptions(
            dispatch=dispatch,
            name=SPAWN_TOOL,
            max_depth=subagents.max_depth,
            max_concurrent=subagents.max_concurrent,
            agents=tuple(named.values()),
        )
        return [restate_spawn_tool(options)]

    @obj.handler(idempotency_retention=RUN_IDEMPOTENCY_RETENTION)
    async def run(ctx: restate.ObjectContext, request: RunRequest) -> RunResult:
        if request.start_by is not None and await ctx.time() > request.start_by:
            log.info(
                "session %s: a run due by %s started late, skipped", ctx.key(), request.start_by
            )
            return RunResult.skipped()
        # Per invocation (stable across its retries), not per session: a session's second run
        # seeded with the key alone got the first one's run id and replaced its record.
        durable = restate_runtime(
            ctx,
            id_seed=f"{ctx.key()}/{ctx.request().id}",
            live_sink=live_sink,
            events_retain=kept.retain,
            budget=ledger_for(ctx) if budgeted else None,
            handoff=handoff,
            stopping=stopping.is_stopping,
        )
        store = durable.stores.session
        assert store is not None
        # With tail compaction the model sees only the newest turns: a run reads only those
        # (and, either way, only the newest run records).
        seen = ContextCovered(window) if compacted else every_turn
        # Held from the start: a new session's first writes go out with its run's first ones.
        with durable.hold_writes():
            session = await load_session(store, ctx.key(), enough=seen)
            if request.fork is not None:
                session = await fork_into(ctx, manifest.metadata.name, store, request.fork, session)
            if request.prompt is None and (session is None or not session.turn_count):
                # Terminal: retried, it would hold the session's key for every later run.
                raise TerminalError("a run of a session with no turns needs a prompt", 400)
            session = session or await create_session(id=ctx.key(), store=store)
            wait = restate_wait(ctx, park_settings)
            agent = create_agent(
                provider=provider,
                fallbacks=fallbacks,
                cooldown=cooldown,
                tools=[*tools_for(ctx, wait), *spawn_for(ctx, 0)],
                system=spec.system,
                output=output,
                durable=durable,
                session=session,
                behavior=behavior,
                hooks=hooks_for(durable, session_id=ctx.key()),
                inbox=RestateInbox(ctx, take_messages),
                wait=wait,  # for more budget (`limits.onExhausted: ask`), as the approvals wait
            )
            with counting_leaves(manifest.metadata.name):
                stats = await agent.run(request.prompt)
        if subagents is not None:
            await forget_children(ctx)
        return RunResult.of(stats)

    @obj.handler(ingress_private=True)
    async def child(ctx: restate.ObjectContext, request: dict[str, Any]) -> dict[str, Any]:
        """A sub-agent run (a `ChildRunRequest`), started by a parent's spawn tool only."""
        child_request = cast(ChildRunRequest, request)
        trace = TraceParent.parse(child_request.get(TRACEPARENT_KEY))
        own: dict[str, Any] = {
            "provider": provider,
            "fallbacks": fallbacks,
            "tools": tools_for(ctx, restate_wait(ctx, park_settings)),
            "system": spec.system,
            "behavior": behavior,
        }
        kind = child_request.get("subagent_type")
        if kind is not None:
            if kind not in named:  # spawned by a version that had it
                return dict(failed_result(f"this version of the agent has no sub-agent {kind!r}"))
            own = named[kind].configure(**own, spawn=SPAWN_TOOL)
        allowed = child_request.get("allowed_tools")
        if allowed is not None:
            own["tools"] = [t for t in own["tools"] if t.name in allowed]
        # A sub-agent never gets a tool its spawner lacks: a named one's children, theirs too.
        narrowed = None if kind is None and allowed is None else [t.name for t in own["tools"]]
        own["tools"].extend(spawn_for(ctx, child_request["depth"], trace, narrowed))
        with counting_leaves(manifest.metadata.name):
            result = await run_child(
                ctx,
                child_request,
                **own,
                cooldown=cooldown,
                max_depth=subagents.max_depth if subagents is not None else 0,
                runtime_options=RestateRuntimeOptions(
                    budget=ledger_for(ctx) if budgeted else None,
                    handoff=handoff,
                    stopping=stopping.is_stopping,
                ),
                hooks=lambda durable: hooks_for(durable, trace, subagent=kind),
            )
        if subagents is not None:
            await forget_children(ctx)
        return dict(result)

    # The shared handlers read a few keys. Lazily: Restate would otherwise send the object's
    # whole state (every turn and event of the session) with each call, and the sidecar polls
    # `events` while a stream is open (a poll on a 5,000-turn session took 61-80 ms, 17-30 ms
    # lazily; 5-16 ms on a 10-turn one either way).
    @obj.handler(kind="shared", enable_lazy_state=True)
    async def session(ctx: restate.ObjectSharedContext) -> dict[str, Any]:
        store = restate_session_store(ctx, read_only=True)  # type: ignore[arg-type]
        loaded = await load_session(store, ctx.key())
        if loaded is None:
            return {"id": ctx.key(), "turns": [], "runs": [], "status": None, "metadata": {}}
        return {
            "id": loaded.id,
            "turns": [t.to_json() for t in loaded.turns],
            "runs": [r.to_json() for r in loaded.runs],
            "status": loaded.runs[-1].status if loaded.runs else None,
            "metadata": loaded.metadata,  # a fork's `forked_from`
        }

    @obj.handler(kind="shared", enable_lazy_state=True)
    async def pending(ctx: restate.ObjectSharedContext) -> list[dict[str, Any]]:
        """The calls parked in this session and in the children its runs are waiting for,
        without their awakeable ids: an id answers its call through Restate's own API, and this
        is open to whoever reaches the ingress (the sidecar lists ids with a signed read of the
        agent's index, `parked_index`)."""
        parked: dict[str, ParkedCall] = await ctx.get(PARKED_STATE_KEY) or {}
        calls: list[dict[str, Any]] = [
            {k: v for k, v in call.items() if k != "awakeable_id"} for call in parked.values()
        ]
        for key in await ctx.state_keys():
            if key.startswith(CHILD_MARKER):
                child_session = key.removeprefix(CHILD_MARKER)
                calls += await ctx.object_call(pending, key=child_session, arg=None)
        return sorted(calls, key=lambda call: call["created_at"])

    @obj.handler(kind="shared", enable_lazy_state=True)
    async def events(ctx: restate.ObjectSharedContext, after: str | None) -> list[dict[str, Any]]:
        """The session's durable events after the event id `after` (`tether.session.events`);
        the sidecar streams them with the live ones of `<agent>-live`."""
        return await read_events(ctx, Cursor.parse(after))

    return [obj]
