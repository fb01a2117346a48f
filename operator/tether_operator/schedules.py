"""The spec's schedules (`spec.schedules`), kept on Restate's `<agent>-schedule/<name>`
(`tether.programs.worker.schedule`, served by the sidecar's index).

Each pass sets a schedule whose hash the status does not show (new, or changed) and stops one
the status shows but the spec no longer has; deleting the agent kills their ticks. Orders go
through Restate's ingress, signed with the agent's webhook key (read from its Secret for the
order, never kept), and carry the DurableAgent's uid and generation: Restate refuses an order
older than the one it keeps, so an operator replica a change behind cannot undo it. A schedule
that could not be set (Restate or the Secret failed) is tried again on the next pass; the status
shows each set schedule's next and last runs as Restate keeps them (one query for all agents).

A person starts a schedule's run at once with the annotation `tether.dev/run-now:
<schedule>@<anything new>` (whoever may patch the DurableAgent may): the operator orders it once
per value of the annotation, and the status keeps the value handled last (`runNow`).
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any
from urllib.parse import quote

import kopf

from tether.programs.restate_admin import AdminCall
from tether.programs.webhooks import schedule_order, schedule_run_order
from tether.spec import DurableAgent, ScheduleSpec, ScheduleStatus, restate_services

from .conditions import rfc3339
from .context import AgentMemory, Operator
from .kube import KubeError
from .names import RUN_NOW_ANNOTATION, content_hash
from .restate_admin import RestateError
from .state_values import number_in, text_in


async def keep(
    op: Operator,
    body: kopf.Body,
    mem: AgentMemory,
    agent: DurableAgent,
    kept: list[ScheduleStatus],
) -> list[ScheduleStatus]:
    """Set the spec's schedules that `kept` (the status) lacks or shows otherwise, and stop
    those it shows that the spec lacks; the schedules as they now are on Restate."""
    wanted = {schedule.name: schedule for schedule in agent.spec.schedules}
    now = {status.name: status for status in kept}
    changed = [s for s in wanted.values() if getattr(now.get(s.name), "hash", None) != _hash(s)]
    gone = [name for name in now if name not in wanted]
    if changed or gone:
        key = await _webhook_key(op, body, mem, agent)
        if key is not None:
            for schedule in changed:
                if await _order(op, body, mem, agent, key, schedule.name, schedule):
                    now[schedule.name] = ScheduleStatus(name=schedule.name, hash=_hash(schedule))
            for name in gone:
                if await _order(op, body, mem, agent, key, name, None):
                    del now[name]
    return [now[name] for name in sorted(now)]


async def observed(
    op: Operator, agent: DurableAgent, kept: list[ScheduleStatus]
) -> list[ScheduleStatus]:
    """`kept` with each schedule's next and last runs as Restate keeps them (as they were, when
    Restate does not answer)."""
    if not kept:
        return kept
    try:
        found = await op.observer.schedules(restate_services(agent.metadata.name).schedule)
    except RestateError:
        return kept
    return [_as_kept(status, found.get(status.name) or {}) for status in kept]


async def run_now(
    op: Operator, body: kopf.Body, mem: AgentMemory, agent: DurableAgent, handled: str | None
) -> str | None:
    """Start a run of the schedule that the annotation `tether.dev/run-now` names, unless its
    value is `handled` already; the value handled now (as it was, to try again next pass)."""
    asked = str((body["metadata"].get("annotations") or {}).get(RUN_NOW_ANNOTATION) or "")
    if not asked or asked == handled:
        return handled
    name = asked.split("@", 1)[0]
    names = [schedule.name for schedule in agent.spec.schedules]
    if name not in names:
        message = f"{RUN_NOW_ANNOTATION}: {asked!r} names no schedule of the spec ({names})"
        kopf.warn(body, reason="RunNowFailed", message=message)
        return asked  # nothing to try again: a new value may name one
    key = await _webhook_key(op, body, mem, agent)
    if key is None:
        return handled
    uid = str(body["metadata"].get("uid", ""))
    order = schedule_run_order(key, name, content_hash(asked), owner=uid, stamp=time.time())
    service = restate_services(agent.metadata.name).schedule
    what = f"running the schedule {name!r} now"
    call: AdminCall[dict[str, Any]] = AdminCall(
        "POST", f"/{service}/{quote(name, safe='')}/run_now", order, what, "RunNowFailed", dict
    )
    try:
        answer = await op.ingress.send(call, changes=True)
    except RestateError as error:
        mem.warn_once(body, "RunNowFailed", str(error))
        return handled
    message = f"the schedule {name!r} started a run in session {answer.get('session')!r}"
    kopf.info(body, reason="RanNow", message=message)
    return asked


async def stop_all(op: Operator, name: str) -> int:
    """Stop every schedule of the agent `name`, which is being deleted, without its key (its
    Secret may be gone first): the ticks that wait for their time are killed through the admin
    API; how many. Called on each pass of the deletion, as a tick that ran meanwhile sends the
    next."""
    return await op.restate.kill_scheduled(restate_services(name).schedule)


def _hash(schedule: ScheduleSpec) -> str:
    return content_hash(schedule.model_dump(by_alias=True, mode="json"))


def _as_kept(status: ScheduleStatus, kept: dict[str, Any]) -> ScheduleStatus:
    return status.model_copy(
        update={
            "next_run": _rfc3339(number_in(kept, "next")),
            "last_run": _rfc3339(number_in(kept, "last")),
            "last_session": text_in(kept, "session"),
            "late_ticks": max(0, int(number_in(kept, "late") or 0)),
        }
    )


YEAR_10000 = 253_402_300_800
"""RFC 3339 has four digits for the year (and the metrics parse it back)."""


def _rfc3339(t: float | None) -> str | None:
    return rfc3339(t) if t is not None and 0 <= t < YEAR_10000 else None


async def _webhook_key(
    op: Operator, body: kopf.Body, mem: AgentMemory, agent: DurableAgent
) -> bytes | None:
    """The agent's current webhook key, from its Secret; None (and a warning) when it cannot be
    read."""
    ref = agent.spec.webhook
    if ref is None:  # the spec refuses schedules without one
        return None
    namespace = body["metadata"]["namespace"]
    where = f"Secret {namespace}/{ref.secret_ref.name}, key {ref.secret_ref.key!r}"
    try:
        secret = await op.kube.get("v1", "Secret", namespace, ref.secret_ref.name)
        encoded = (secret or {}).get("data", {}).get(ref.secret_ref.key)
        if encoded:
            return base64.b64decode(encoded, validate=True)
        problem = "not found"
    except (KubeError, binascii.Error, TypeError) as error:
        problem = str(error)
    mem.warn_once(body, "ScheduleFailed", f"the webhook key ({where}) signs schedules: {problem}")
    return None


async def _order(
    op: Operator,
    body: kopf.Body,
    mem: AgentMemory,
    agent: DurableAgent,
    key: bytes,
    name: str,
    schedule: ScheduleSpec | None,
) -> bool:
    """Set (or, with None, stop) the schedule `name`; whether Restate took the order."""
    meta = body["metadata"]
    order = schedule_order(
        key,
        name,
        None if schedule is None else schedule.model_dump(by_alias=True, mode="json"),
        owner=str(meta.get("uid", "")),
        generation=int(meta.get("generation") or 0),
        stamp=time.time(),
    )
    what = f"{'setting' if schedule else 'stopping'} the schedule {name!r}"
    service = restate_services(agent.metadata.name).schedule
    call: AdminCall[object] = AdminCall(
        "POST", f"/{service}/{quote(name, safe='')}/set", order, what, "ScheduleFailed", dict
    )
    try:
        await op.ingress.send(call, changes=True)
    except RestateError as error:
        mem.warn_once(body, "ScheduleFailed", str(error))
        return False
    kopf.info(body, reason="Scheduled", message=f"{what} on Restate: done")
    return True
