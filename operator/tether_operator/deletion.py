"""Deleting a DurableAgent: the finalizer waits for the runs in flight, bounded by drain.timeout,
then unregisters every version from Restate and deletes their objects, then the sidecar's."""

from __future__ import annotations

import time
from collections.abc import Iterable

import kopf

from tether.spec import DurableAgent, DurableAgentStatus, SpecError, parse_duration

from . import children, metrics, scaling, schedules
from .conditions import DRAINING, READY, Verdict, merge, parse_rfc3339
from .context import AgentMemory, Operator
from .kube import KubeError
from .names import RESTATE_AGENT_KEY, RESTATE_ROLE_KEY, restate_agent
from .restate_admin import CANCEL_GRACE, InFlight, RestateError
from .supervisor import base_status, parse, registered_versions, write_status

POLL = 2.0
DELETING = ":deleting"
"""`AgentMemory.cancelled_at`'s key for the runs cancelled at the deletion's drain.timeout."""


def _agent(body: kopf.Body) -> DurableAgent | None:
    try:
        return parse(body)
    except SpecError:
        return None


async def _say(
    op: Operator, body: kopf.Body, mem: AgentMemory, ok: bool, reason: str, message: str
) -> None:
    previous = base_status(body, mem)
    verdicts = [
        Verdict(READY, False, "Deleting", "the agent is being deleted"),
        Verdict(DRAINING, ok, reason, message),
    ]
    status = previous.model_copy(
        update={
            "phase": "Deleting",
            "conditions": merge(previous.conditions, verdicts, body["metadata"].get("generation")),
        }
    )
    await write_status(op, body, mem, DurableAgentStatus.model_validate(status.model_dump()))


async def _wake(
    op: Operator, body: kopf.Body, mem: AgentMemory, agent: DurableAgent | None, in_flight: InFlight
) -> None:
    """Versions at zero replicas whose runs have work get their pods back: the wait is for
    those runs to finish."""
    previous = base_status(body, mem)
    try:
        versions = await scaling.wake_for_deletion(op, body, agent, previous.versions, in_flight)
    except KubeError as error:
        raise kopf.TemporaryError(f"scaling a version up failed: {error}", delay=POLL) from None
    if versions != previous.versions:
        mem.status = previous.model_copy(update={"versions": versions})


def _retry_or_give_up(body: kopf.Body, error: RestateError, left: float, what: str) -> None:
    """Retry while drain.timeout has not passed; then say what is left to remove by hand."""
    if left > 0:
        raise kopf.TemporaryError(str(error), delay=POLL) from None
    kopf.warn(
        body,
        reason="UnregistrationFailed",
        message=f"{error}; remove {what} with the Restate CLI",
    )


async def _unregister(op: Operator, body: kopf.Body, deployment_id: str, left: float) -> None:
    try:
        await op.restate.unregister(deployment_id)
    except RestateError as error:
        _retry_or_give_up(body, error, left, f"deployment {deployment_id}")


async def _end_runs(
    op: Operator, body: kopf.Body, mem: AgentMemory, ids: Iterable[str], waiting: int
) -> None:
    """Once drain.timeout passed: cancel the runs pinned to the agent's versions (`ids`; one
    queued behind one is pinned in its turn, and cancelled at the next pass), retrying until
    none is left, and kill those left after `CANCEL_GRACE`. None may stay holding its
    session, which an agent made again under the name would find locked. Only its own
    versions' runs: a service name another agent holds is that agent's."""
    first = mem.cancelled_at.setdefault(DELETING, time.monotonic())
    kill = time.monotonic() - first >= CANCEL_GRACE
    ended = 0
    for deployment_id in ids:
        try:
            ended += await op.restate.end_pinned(deployment_id, kill=kill)
        except RestateError as error:  # the deletion goes on: drain.timeout has passed
            kopf.warn(
                body,
                reason="UnregistrationFailed",
                message=f"{error}; end the runs pinned to {deployment_id} with the Restate CLI",
            )
    how = "killed" if kill else f"cancelling them (killed after {CANCEL_GRACE:.0f}s)"
    if kill or DELETING not in mem.warned:
        mem.warned.add(DELETING)
        kopf.warn(
            body,
            reason="DrainTimeout",
            message=f"drain.timeout passed with {waiting} runs in flight; {ended} pinned: {how}",
        )
    if ended and not kill:
        raise kopf.TemporaryError(f"cancelled {ended} runs", delay=POLL)


async def _unregister_sidecar(op: Operator, body: kopf.Body, left: float) -> None:
    """Unregister the sidecar's index, once the versions whose runs answer through it are gone
    (found by its metadata: the status may have lost its id)."""
    meta = body["metadata"]
    owner = restate_agent(meta["namespace"], meta["name"])
    try:
        found = await op.restate.deployments()
    except RestateError as error:
        _retry_or_give_up(body, error, left, "the sidecar's deployment")
        return
    for deployment in found:
        metadata = deployment.get("metadata") or {}
        if metadata.get(RESTATE_AGENT_KEY) == owner and metadata.get(RESTATE_ROLE_KEY):
            await _unregister(op, body, deployment["id"], left)


async def drain_before_delete(op: Operator, body: kopf.Body, mem: AgentMemory) -> None:
    """Raise `kopf.TemporaryError` while runs are in flight and drain.timeout has not passed."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    versions = list(base_status(body, mem).versions)
    known = {v.hash for v in versions}
    extra = await children.versions_on_cluster(op.kube, namespace, name)
    ids = {v.hash: v.restate_deployment_id for v in versions if v.restate_deployment_id}
    agent = _agent(body)
    timeout = parse_duration(agent.spec.drain.timeout) if agent is not None else 0.0
    started = parse_rfc3339(meta.get("deletionTimestamp") or time.strftime("%Y-%m-%dT%H:%M:%SZ"))
    left = started + timeout - time.time()
    try:
        # No schedule starts a run while the others drain, or after.
        await schedules.stop_all(op, name)
        # and the versions Restate has that the status lost: their runs drain too
        found = await registered_versions(op, namespace, name)
        ids |= {digest: d["id"] for digest, d in found.items() if d.get("id")}
        in_flight = await op.observer.in_flight(max_age=0.0)
        pinned = {h: in_flight.pinned.get(i, 0) for h, i in ids.items()}
        waiting = sum(pinned.values()) + in_flight.unpinned.get(name, 0)
    except RestateError as error:
        if left > 0:
            await _say(op, body, mem, True, error.reason, f"{error}; retrying until it answers")
            raise kopf.TemporaryError(str(error), delay=min(POLL * 2, max(left, 1.0))) from None
        kopf.warn(body, reason="DrainTimeout", message=f"{error}; deleting without draining")
        pinned, waiting = {}, 0
    if waiting and left > 0:
        await _wake(op, body, mem, agent, in_flight)
        detail = ", ".join(f"{h}: {n}" for h, n in sorted(pinned.items()) if n)
        message = (
            f"waiting for {waiting} runs in flight ({detail or 'not started yet'}) before "
            f"unregistering; drain.timeout ends the wait in {left:.0f}s"
        )
        await _say(op, body, mem, True, "WaitingForRuns", message)
        if "waiting" not in mem.warned:
            mem.warned.add("waiting")
            kopf.info(body, reason="WaitingForRuns", message=message)
        raise kopf.TemporaryError(message, delay=min(POLL, max(left, 0.5)))
    if waiting:
        await _wake(op, body, mem, agent, in_flight)  # a cancelled run needs a pod
        await _end_runs(op, body, mem, ids.values(), waiting)
    for digest, deployment_id in ids.items():
        await _unregister(op, body, deployment_id, left)
        kopf.info(body, reason="Unregistered", message=f"version {digest} ({deployment_id})")
    for digest in known | extra:
        await children.delete_version(op.kube, namespace, name, digest)
    await _unregister_sidecar(op, body, left)
    await children.delete_sidecar(op.kube, namespace, name)
    metrics.forget(namespace, name, mem.gauges)
    metrics.forget(namespace, name, mem.schedule_gauges, metrics.SCHEDULE_GAUGES)
    metrics.forget(namespace, name, mem.spend_gauges, metrics.SPEND_GAUGES)
    await _say(op, body, mem, False, "Deleted", "every version is unregistered and deleted")
