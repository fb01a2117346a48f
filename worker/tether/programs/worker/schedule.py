"""`<agent>-schedule/<name>`: a schedule of `spec.schedules`, which starts the agent's runs at
the times of its cron expression.

The operator sets each schedule of the spec here (`set`), and stops those the spec no longer
has or whose agent is deleted, with orders signed with the webhook secret: the agent's tools
reach the ingress too, and must not start its runs at times (or with prompts) of their own. An
order carries the DurableAgent's uid and `metadata.generation`, and one of the same agent older
than the schedule's is refused, so a slow operator replica cannot put back what a newer spec
changed (an agent deleted and made again under its name has another uid, and its schedule
starts afresh: the deleted agent's tick was killed, and its runs are not the new one's).

The object sends itself a `tick` for the next time due, delayed until then, and keeps that
invocation's id to cancel it when the schedule changes; a tick that is no longer the one
expected (a cancel that came too late) does nothing. A tick sends the run with an idempotency
key of the schedule, the time and a tag only the webhook secret makes, so a time's run starts
once, and a caller of the agent's `run` cannot take that key first (and have its own run stand
for the schedule's). A tick that comes late (Restate was down) runs the latest time due and
skips those before it; a run of a schedule's own session waits behind the session's runs, and
one still waiting at the next time is skipped
(`RunRequest.start_by`). `run_now` starts a run at once, as a person asked through the
operator (`tether.dev/run-now`), once per request (the last `RUN_NOW_KEPT` are remembered).
Served with the index (`served`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import restate
from restate.exceptions import TerminalError

from ...cron import Cron
from ...spec import ScheduleSpec, restate_services
from ..webhooks import hmac_hex, schedule_run_signature, schedule_signature, signed_by_any
from .untrusted import parsed

log = logging.getLogger(__name__)

STATE = "schedule"
FRESH_SECONDS = 60
"""How far an order's stamp may be from the object's clock."""
RUN_NOW_KEPT = 16
"""How many of the last requests to run a schedule now it remembers: an annotation put back to
an earlier value (a revert) starts nothing again."""


def schedule_object(agent: str, secrets: Sequence[bytes]) -> restate.VirtualObject:
    """`<agent>-schedule`, keyed by a schedule's name: `set` and `run_now` (signed), `tick` (its
    own, at each time due) and `describe`."""
    services = restate_services(agent)
    obj = restate.VirtualObject(
        services.schedule, description=f"The schedules that start runs of the {agent} agent."
    )

    def run_key(*parts: object) -> str:
        """An idempotency key for a schedule's run that only the secret's holder makes."""
        key = "/".join(["schedule", *map(str, parts)])
        tag = hmac_hex(secrets[0] if secrets else b"", key.encode())[:16]
        return f"{key}/{tag}"

    @obj.handler()
    async def set(ctx: restate.ObjectContext, order: dict[str, Any]) -> dict[str, Any]:
        """Set the schedule (`order["schedule"]`, a `ScheduleSpec`'s JSON) or stop it (None);
        answers the next time due (None: none)."""
        schedule, owner, generation = await _checked(ctx, secrets, order)
        kept: dict[str, Any] = await ctx.get(STATE) or {}
        if owner == kept.get("owner") and generation < kept["generation"]:
            raise TerminalError(
                f"the schedule is kept as of generation {kept['generation']}, newer than "
                f"{generation}",
                status_code=409,
            )
        if kept and owner != kept.get("owner"):  # another DurableAgent of the name: afresh
            _cancel_tick(ctx, kept)
            ctx.clear_all()
            kept = {}
        if schedule is None:
            _cancel_tick(ctx, kept)
            ctx.clear_all()
            return {"next": None}
        config = schedule.model_dump(by_alias=True, mode="json")
        if config == kept.get("config"):  # as it was: its next tick stands
            ctx.set(STATE, {**kept, "owner": owner, "generation": generation})
            return {"next": kept.get("next")}
        _cancel_tick(ctx, kept)
        now = await ctx.time()
        due = None if schedule.suspend else _cron(schedule).next_after(now)
        kept = {**kept, "config": config, "owner": owner, "generation": generation, "next": due}
        ctx.set(STATE, await _send_tick(ctx, services.schedule, kept, now))
        return {"next": due}

    @obj.handler()
    async def run_now(ctx: restate.ObjectContext, order: dict[str, Any]) -> dict[str, Any]:
        """Start a run of the schedule now, with its prompt, in its session (or one of its
        own), once per `order["request"]`; answers the run's session. It is the schedule's
        last run; its next time stays as it is."""
        request, owner = await _checked_run(ctx, secrets, order)
        kept: dict[str, Any] = await ctx.get(STATE) or {}
        if not kept:
            raise TerminalError(f"no schedule {ctx.key()!r} is set", status_code=404)
        if owner != kept["owner"]:
            raise TerminalError("the schedule is another DurableAgent's", status_code=409)
        manual: list[dict[str, str]] = kept.get("manual") or []
        if isinstance(manual, dict):  # kept by a worker that remembered only the last one
            manual = [manual]
        for earlier in manual:
            if earlier["request"] == request:  # the same order again: its run has started
                return {"session": earlier["session"]}
        schedule = ScheduleSpec.model_validate(kept["config"])
        now = await ctx.time()
        # Its own session unless the schedule has one: not a tick's, nor another request's.
        session = schedule.session or f"{schedule.name}-{_stamp(now)}-{request[:8]}"
        ctx.generic_send(
            services.agent,
            "run",
            json.dumps({"prompt": schedule.prompt}).encode(),
            key=session,
            idempotency_key=run_key(schedule.name, "now", owner, request),
        )
        manual = [*manual, {"request": request, "session": session}][-RUN_NOW_KEPT:]
        ctx.set(STATE, {**kept, "last": now, "session": session, "manual": manual})
        return {"session": session}

    @obj.handler(ingress_private=True)
    async def tick(ctx: restate.ObjectContext, due: float) -> None:
        kept: dict[str, Any] = await ctx.get(STATE) or {}
        if not kept or kept.get("next") != due:
            return  # stopped, or changed since this tick was sent
        schedule = ScheduleSpec.model_validate(kept["config"])
        cron = _cron(schedule)
        now = await ctx.time()
        # `due`, or a later time when this tick came late (never an earlier one: Restate may
        # deliver a delayed call a moment before the worker's clock says it is due).
        at = max(due, cron.last_due(now))
        following = cron.next_after(max(now, at))
        session = schedule.session or f"{schedule.name}-{_stamp(at)}"
        request: dict[str, Any] = {"prompt": schedule.prompt}
        if schedule.session is not None:  # behind the session's runs: not past the next time
            request["start_by"] = following
        ctx.generic_send(
            services.agent,
            "run",
            json.dumps(request).encode(),
            key=session,
            idempotency_key=run_key(schedule.name, int(at)),
        )
        late = kept.get("late", 0)
        if at > due:
            late += 1
            log.warning(
                "schedule %s of %s: the run due at %s is skipped for the one due at %s",
                schedule.name,
                agent,
                _stamp(due),
                _stamp(at),
            )
        kept = {**kept, "next": following, "last": at, "session": session, "late": late}
        ctx.set(STATE, await _send_tick(ctx, services.schedule, kept, now))

    @obj.handler(kind="shared")
    async def describe(ctx: restate.ObjectSharedContext) -> dict[str, Any]:
        """The schedule as kept: its cron, time zone, session and suspension, the agent's
        generation that set it, its next time due, its last run's time and session, and how
        many of its ticks came late, skipping earlier times for the latest, and the last
        requests to run it now (`manual`, the newest last); not its prompt;
        `{"schedule": None}` when none is set."""
        kept: dict[str, Any] | None = await ctx.get(STATE)
        if not kept:
            return {"schedule": None}
        config = {k: v for k, v in kept["config"].items() if k != "prompt"}
        fields = ("generation", "next", "last", "session", "late", "manual")
        return {"schedule": config, **{field: kept.get(field) for field in fields}}

    return obj


def _cron(schedule: ScheduleSpec) -> Cron:
    return Cron(schedule.cron, schedule.time_zone)


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y%m%dt%H%M%Sz")


async def _send_tick(
    ctx: restate.ObjectContext, service: str, kept: dict[str, Any], now: float
) -> dict[str, Any]:
    """`kept` with the id of the tick sent for its next time (none without one)."""
    due = kept.get("next")
    if due is None:
        return {**kept, "tick": None}
    handle = ctx.generic_send(
        service,
        "tick",
        json.dumps(due).encode(),
        key=ctx.key(),
        send_delay=timedelta(seconds=max(0.0, due - now)),
    )
    return {**kept, "tick": await handle.invocation_id()}


def _cancel_tick(ctx: restate.ObjectContext, kept: dict[str, Any]) -> None:
    if kept.get("tick"):
        ctx.cancel_invocation(kept["tick"])


async def _checked(
    ctx: restate.ObjectContext, secrets: Sequence[bytes], order: Any
) -> tuple[ScheduleSpec | None, str, int]:
    """The schedule (None: stop it), owner and generation of an order one of `secrets` signed,
    made within `FRESH_SECONDS`."""

    def parse() -> tuple[Any, str, int, float, ScheduleSpec | None]:
        raw = order["schedule"]
        schedule = None if raw is None else ScheduleSpec.model_validate(raw)
        owner, generation = str(order["owner"]), int(order["generation"])
        return order["sig"], owner, generation, float(order["stamp"]), schedule

    given, owner, generation, stamp, schedule = parsed("a signed order for a schedule", parse)
    await _verify(ctx, secrets, order, given, stamp, schedule_signature)
    if schedule is not None and schedule.name != ctx.key():
        raise TerminalError(f"the schedule is named {schedule.name!r}, not {ctx.key()!r}", 400)
    return schedule, owner, generation


async def _checked_run(
    ctx: restate.ObjectContext, secrets: Sequence[bytes], order: Any
) -> tuple[str, str]:
    """The request id and owner of an order to run now, signed with one of `secrets` and made
    within `FRESH_SECONDS`."""
    given, request, owner, stamp = parsed(
        "a signed order to run now",
        lambda: (order["sig"], str(order["request"]), str(order["owner"]), float(order["stamp"])),
    )
    await _verify(ctx, secrets, order, given, stamp, schedule_run_signature)
    return request, owner


async def _verify(
    ctx: restate.ObjectContext,
    secrets: Sequence[bytes],
    order: Any,
    given: Any,
    stamp: float,
    sign: Callable[[bytes, str, Any], str],
) -> None:
    """Refuse an order that none of `secrets` signed (`sign`) or that was made more than
    `FRESH_SECONDS` from now."""
    if not signed_by_any(secrets, given, lambda s: sign(s, ctx.key(), order)):
        raise TerminalError("not signed by the operator of this agent", status_code=401)
    if abs(await ctx.time() - stamp) > FRESH_SECONDS:
        raise TerminalError("the order is stale: sign it again", status_code=401)
