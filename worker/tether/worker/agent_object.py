"""The agent as Restate services: a virtual object per session, keyed by session id.

`<agent>/<session>/run` (exclusive) runs the agent on `restate_runtime` with the session in the
object's state; `session` and `pending` (shared) read it while a run is going on.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import restate
from pydantic import BaseModel, Field

from ..agent import AgentStats, create_agent
from ..assemble import api_key_for, behavior_from_spec, provider_from_spec, tools_from_spec
from ..metrics import agent_hooks
from ..parked import PARKED_STATE_KEY, ParkedCall
from ..providers.base import Provider
from ..restate import restate_runtime, restate_session_store
from ..session import create_session, load_session
from ..spec import SpecError, ToolSpecEntry, parse_duration
from ..tools.base import ToolDef
from .gates import approval_gate, ask_human_tool
from .parking import ParkSettings
from .settings import WorkerSettings

PARK_AFTER = timedelta(seconds=10)
"""A run waiting on a person (or a timer) suspends after this long without journal progress, so
parked runs hold no worker; a step that is still running is not cut by it."""
LONGEST_STEP = timedelta(minutes=30)
"""After the suspension request, how long a running step (a long model stream) may still take
before Restate aborts the attempt and retries it."""


class RunRequest(BaseModel):
    """Start or continue the session's conversation."""

    prompt: str | None = Field(
        default=None, description="The task; may be omitted when the session already has turns."
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
        )


def build_provider(settings: WorkerSettings) -> Provider:
    spec = settings.manifest.spec
    key = api_key_for(spec, dict(settings.env))
    if spec.model.provider != "scripted" and not key:
        variable = spec.model.api_key_env or f"{spec.model.provider.upper()}_API_KEY"
        raise SpecError(f"{variable} is not set: the worker needs the model's API key")
    return provider_from_spec(spec, key or "")


def agent_object(settings: WorkerSettings) -> restate.VirtualObject:
    """The agent's virtual object, named after the agent."""
    manifest = settings.manifest
    spec = manifest.spec
    provider = build_provider(settings)
    behavior = behavior_from_spec(spec)
    approvals = spec.approvals
    park_settings = ParkSettings(
        agent=manifest.metadata.name,
        timeout_seconds=parse_duration(approvals.timeout),
        notify_url=approvals.notify.url if approvals.notify else None,
        webhook_secret=settings.webhook_secret,
        webhook_base_url=settings.webhook_base_url,
    )
    obj = restate.VirtualObject(
        manifest.metadata.name,
        description=f"The {manifest.metadata.name} agent; the object key is the session id.",
        inactivity_timeout=PARK_AFTER,
        abort_timeout=LONGEST_STEP,
    )

    def tools_for(ctx: restate.ObjectContext) -> list[ToolDef]:
        def parking(entry: ToolSpecEntry, inner: ToolDef | None) -> ToolDef:
            if inner is None:
                return ask_human_tool(entry.name, ctx, park_settings)
            return approval_gate(inner, ctx, park_settings, approvals.on_timeout)

        return tools_from_spec(spec, settings.workspace, parking)

    @obj.handler()
    async def run(ctx: restate.ObjectContext, request: RunRequest) -> RunResult:
        durable = restate_runtime(ctx, id_seed=ctx.key())
        store = durable.stores.session
        assert store is not None
        session = await load_session(store, ctx.key()) or await create_session(
            id=ctx.key(), store=store
        )
        agent = create_agent(
            provider=provider,
            tools=tools_for(ctx),
            system=spec.system,
            durable=durable,
            session=session,
            behavior=behavior,
            hooks=agent_hooks(
                manifest.metadata.name,
                provider=provider.name,
                model=provider.model,
                durable=durable,
            ),
        )
        return RunResult.of(await agent.run(request.prompt))

    @obj.handler(kind="shared")
    async def session(ctx: restate.ObjectSharedContext) -> dict[str, Any]:
        store = restate_session_store(ctx, read_only=True)  # type: ignore[arg-type]
        loaded = await load_session(store, ctx.key())
        if loaded is None:
            return {"id": ctx.key(), "turns": [], "runs": [], "status": None}
        return {
            "id": loaded.id,
            "turns": [t.to_json() for t in loaded.turns],
            "runs": [r.to_json() for r in loaded.runs],
            "status": loaded.runs[-1].status if loaded.runs else None,
        }

    @obj.handler(kind="shared")
    async def pending(ctx: restate.ObjectSharedContext) -> list[ParkedCall]:
        parked: dict[str, ParkedCall] = await ctx.get(PARKED_STATE_KEY) or {}
        return sorted(parked.values(), key=lambda call: call["created_at"])

    return obj
