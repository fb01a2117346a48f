"""One supervision pass over a DurableAgent: register, drain, retire, report.

The pass is level-triggered and idempotent: it reads what exists (the status it last wrote, the
version Deployments from kopf's index, Restate's deployments once per process) and moves every
version one step towards the goal:

- the agent's sidecar (shared by its versions) is registered with Restate once its pods run
  its current template: it serves the index of parked calls and the live events that every
  version's runs send to, so a version is registered only after it;
- the version of the current spec becomes `Active` as soon as its Deployment is available:
  its URL is registered with Restate (with `force`, so a rollback to an earlier, still
  registered URL becomes the latest deployment again), and the previous `Active` one starts
  `Draining`;
- a `Draining` version stays while Restate has invocations pinned to it; once none are left and
  `drain.delay` has passed, it is unregistered, then its objects are deleted; after
  `drain.timeout` it goes regardless, with a Warning event;
- a version that was never registered and is no longer wanted is deleted at once;
- with `spec.scaling.idleAfter`, a version whose runs only wait goes to zero replicas and comes
  back when one has work, or, for the active version, when a new run comes (`scaling`).

Nothing is ever removed because Restate or the API server failed to answer: a failure becomes a
condition and the step is retried with backoff.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import kopf

from tether.spec import (
    DurableAgent,
    DurableAgentStatus,
    SidecarStatus,
    SpecError,
    VersionStatus,
    parse_agent,
    parse_duration,
)

from . import children, metrics, render, scaling, schedules, spend
from .conditions import (
    DRAINING,
    PROGRESSING,
    READY,
    REGISTERED,
    Verdict,
    merge,
    now_rfc3339,
    parse_rfc3339,
)
from .context import AgentMemory, Operator
from .kube import KubeError
from .names import (
    RESTATE_AGENT_KEY,
    RESTATE_ROLE_KEY,
    RESTATE_VERSION_KEY,
    SIDECAR_VERSION,
    restate_agent,
    restate_metadata,
    sidecar_metadata,
)
from .ownership import other_owner
from .restate_admin import CANCEL_GRACE, InFlight, RestateError

log = logging.getLogger("tether_operator")

Versions = dict[str, VersionStatus]
#: Seconds after applying a version before a missing Deployment counts as deleted.
REPAIR_AFTER = 3.0
#: Seconds a version's URL may not answer the operator before it is registered anyway.
ROUTE_WAIT = 10.0


def parse(body: kopf.Body) -> DurableAgent:
    document = {k: body.get(k) for k in ("apiVersion", "kind", "metadata", "spec")}
    document["metadata"] = {
        "name": body["metadata"]["name"],
        "namespace": body["metadata"].get("namespace"),
    }
    return parse_agent(document)


def base_status(body: kopf.Body, mem: AgentMemory) -> DurableAgentStatus:
    if mem.status is not None:
        return mem.status
    raw = {k: v for k, v in (body.get("status") or {}).items() if k != "kopf"}
    try:
        return DurableAgentStatus.model_validate(raw)
    except ValueError:
        return DurableAgentStatus()


async def write_status(
    op: Operator, body: kopf.Body, mem: AgentMemory, status: DurableAgentStatus
) -> None:
    """Merge-patch the status if it changed; keys that disappeared are removed (null)."""
    before = base_status(body, mem).model_dump(by_alias=True, exclude_none=True, mode="json")
    after = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    if mem.status is not None and before == after:
        return
    patch: dict[str, Any] = {k: None for k in before if k not in after}
    patch.update(after)
    meta = body["metadata"]
    await op.kube.patch_status(meta["namespace"], meta["name"], patch)
    mem.status = status


# ------------------------------------------------------------------------------------------
# Reconciling the version list with what exists


async def registered_versions(op: Operator, namespace: str, name: str) -> dict[str, Any]:
    """The agent's versions' Restate deployments by hash, found by their metadata: the status
    may have lost one (a crash, or a status write that failed after a registration)."""
    owner = restate_agent(namespace, name)
    return {
        d["metadata"].get(RESTATE_VERSION_KEY, ""): d
        for d in await op.restate.deployments()
        if (d.get("metadata") or {}).get(RESTATE_AGENT_KEY) == owner
        and not d["metadata"].get(RESTATE_ROLE_KEY)  # the sidecar is no version
    }


async def sync_once(
    op: Operator, body: kopf.Body, mem: AgentMemory, versions: Versions, desired: str
) -> None:
    """After a (re)start: adopt Restate deployments and children that the status lost."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    registered = await registered_versions(op, namespace, name)
    now = now_rfc3339()
    for digest, found in registered.items():
        version = versions.get(digest)
        if version is None:
            versions[digest] = VersionStatus(
                hash=digest,
                state="Draining",
                restate_deployment_id=found["id"],
                created_at=now,
                draining_since=now,
                url=found.get("uri"),
            )
        elif version.restate_deployment_id != found["id"]:
            versions[digest] = version.model_copy(update={"restate_deployment_id": found["id"]})
    for digest, version in list(versions.items()):
        gone = version.restate_deployment_id and digest not in registered
        if gone:  # Restate lost it, or we unregistered it just before a crash
            state = "Pending" if version.state == "Active" else version.state
            versions[digest] = version.model_copy(
                update={"restate_deployment_id": None, "state": state}
            )
    for digest in await children.versions_on_cluster(op.kube, namespace, name):
        if digest not in versions and digest != desired:
            versions[digest] = VersionStatus(
                hash=digest, state="Draining", created_at=now, draining_since=now
            )
    mem.synced = True


def _adopt_deployments(
    versions: Versions, deployments: list[children.WorkerDeployment], desired: str
) -> None:
    now = now_rfc3339()
    for found in deployments:
        if found.hash not in versions:
            wanted = found.hash == desired
            versions[found.hash] = VersionStatus(
                hash=found.hash,
                state="Pending" if wanted else "Draining",
                created_at=now,
                draining_since=None if wanted else now,
            )


# ------------------------------------------------------------------------------------------
# Steps


def _registration_failed(mem: AgentMemory, body: kopf.Body, what: str, error: RestateError) -> None:
    delay = mem.registration.failed()
    mem.registration_problem = Verdict(REGISTERED, False, error.reason, str(error))
    log.info("registration of %s failed; next attempt in %.0fs", what, delay)
    mem.warn_once(body, error.reason, str(error))


def _registration_succeeded(mem: AgentMemory) -> None:
    mem.registration.succeeded()
    mem.registration_problem = None
    mem.warned.clear()


async def _refuse_taken_names(op: Operator, namespace: str, name: str) -> None:
    taken_by = await other_owner(op, namespace, name)
    if taken_by is not None:
        raise RestateError(
            "ServiceNameTaken",
            f"the Restate services of {name!r} are served by {taken_by}; Restate's service "
            "names are shared by all namespaces, so give this agent another name",
        )


async def _routed(mem: AgentMemory, key: str, url: str) -> bool:
    """Whether to register `url` now: it answers, or it has not for `ROUTE_WAIT`. The Service
    may route to ready pods a moment later; but the operator may be kept from the pods (a
    NetworkPolicy) where Restate is not."""
    if await children.answers(url):
        return True
    first = mem.unanswered_since.setdefault(key, time.monotonic())
    return time.monotonic() - first >= ROUTE_WAIT


async def register_sidecar(
    op: Operator,
    body: kopf.Body,
    mem: AgentMemory,
    agent: DurableAgent,
    pods: children.WorkerDeployment | None,
) -> SidecarStatus | None:
    """Register the sidecar's index with Restate once its pods run its current template (again
    after a change: the image may serve other handlers); its status, as it is now."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    current = base_status(body, mem).sidecar
    digest = render.sidecar_objects(agent, namespace, op.settings).hash
    if current is not None and current.hash == digest and current.restate_deployment_id:
        return current
    if mem.blocker is not None or not mem.registration.ready():
        return current
    if pods is None or not pods.available:  # all its pods on its current template
        return current
    url = await children.sidecar_url(op.kube, op.settings, namespace, name)
    if url is None or not await _routed(mem, SIDECAR_VERSION, url):
        return current
    try:
        await _refuse_taken_names(op, namespace, name)
        deployment_id = await op.restate.register(url, sidecar_metadata(namespace, name))
    except RestateError as error:
        _registration_failed(mem, body, "the sidecar", error)
        return current
    _registration_succeeded(mem)
    mem.unanswered_since.pop(SIDECAR_VERSION, None)  # its next change waits for it again
    kopf.info(
        body,
        reason="Registered",
        message=f"the sidecar's index registered with Restate as {deployment_id} at {url}",
    )
    return SidecarStatus(hash=digest, restate_deployment_id=deployment_id, url=url)


async def register_desired(
    op: Operator,
    body: kopf.Body,
    mem: AgentMemory,
    versions: Versions,
    desired: str,
    available: dict[str, bool],
) -> None:
    version = versions[desired]
    if version.state == "Active" and version.restate_deployment_id:
        return
    if not available.get(desired) or not mem.registration.ready():
        return
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    url = mem.urls.get(desired) or await children.version_url(
        op.kube, op.settings, namespace, name, desired
    )
    if url is None:
        return
    if not await _routed(mem, desired, url):
        return
    try:
        await _refuse_taken_names(op, namespace, name)
        deployment_id = await op.restate.register(url, restate_metadata(namespace, name, desired))
    except RestateError as error:
        _registration_failed(mem, body, desired, error)
        return
    _registration_succeeded(mem)
    now = now_rfc3339()
    rollback = version.state == "Draining"
    versions[desired] = version.model_copy(
        update={
            "state": "Active",
            "restate_deployment_id": deployment_id,
            "draining_since": None,
            "url": url,
        }
    )
    kopf.info(
        body,
        reason="Registered",
        message=f"version {desired} registered with Restate as {deployment_id} at {url}"
        + (" (rolled back to it)" if rollback else ""),
    )
    for digest, other in list(versions.items()):
        if digest != desired and other.state in ("Active", "Pending"):
            versions[digest] = other.model_copy(update={"state": "Draining", "draining_since": now})
            kopf.info(
                body,
                reason="Draining",
                message=f"version {digest} takes no new runs; it stays until the runs pinned to "
                "it finish",
            )


async def retire(
    op: Operator, body: kopf.Body, version: VersionStatus, why: str, warning: bool = False
) -> None:
    """Unregister from Restate first (restate-operator #137), then delete the objects."""
    meta = body["metadata"]
    if version.restate_deployment_id:
        await op.restate.unregister(version.restate_deployment_id)
    await children.delete_version(op.kube, meta["namespace"], meta["name"], version.hash)
    message = f"version {version.hash} unregistered and deleted: {why}"
    if warning:
        kopf.warn(body, reason="DrainTimeout", message=message)
    else:
        kopf.info(body, reason="Retired", message=message)


async def drain_old(
    op: Operator,
    body: kopf.Body,
    agent: DurableAgent,
    mem: AgentMemory,
    versions: Versions,
    desired: str,
) -> InFlight | None:
    draining = [v for v in versions.values() if v.hash != desired and v.state != "Active"]
    # Fresh counts while a version drains, or waits at zero replicas for a run to wake it.
    asleep = any(v.scaled_to_zero_at for v in versions.values())
    try:
        in_flight = await op.observer.in_flight(max_age=1.0 if draining or asleep else 10.0)
    except RestateError as error:
        mem.restate_problem = Verdict(DRAINING, bool(draining), error.reason, str(error))
        return None
    mem.restate_problem = None
    delay = parse_duration(agent.spec.drain.delay)
    timeout = parse_duration(agent.spec.drain.timeout)
    meta = body["metadata"]
    registered: dict[str, Any] | None = None  # asked once, and only for a version without id
    for version in draining:
        if version.restate_deployment_id is None and mem.synced:
            # A status write that failed after its registration lost its id: Restate knows.
            if registered is None:
                registered = await registered_versions(op, meta["namespace"], meta["name"])
            found = registered.get(version.hash)
            if found is None:
                await retire(op, body, version, "never registered")
                del versions[version.hash]
                continue
            version = version.model_copy(update={"restate_deployment_id": found["id"]})
            versions[version.hash] = version
        pinned = in_flight.pinned.get(version.restate_deployment_id or "", 0)
        age = time.time() - parse_rfc3339(version.draining_since or now_rfc3339())
        if pinned == 0 and age >= delay:
            # A shared count may predate a run that got pinned just before this version
            # stopped being the latest: retire only on a count read now.
            in_flight = await op.observer.in_flight(max_age=0.0)
            pinned = in_flight.pinned.get(version.restate_deployment_id or "", 0)
            if pinned == 0:
                await retire(op, body, version, "no runs pinned to it")
                del versions[version.hash]
                continue
        if age >= timeout:
            why = f"drain.timeout ({agent.spec.drain.timeout}) passed with {pinned} runs pinned"
            if version.restate_deployment_id:
                # Cancelled first, to clean up (then retired above once none is pinned); killed
                # if any is left after the grace: none may stay holding its session.
                drain = f"{version.hash}@{version.draining_since}"  # a rollback drains anew
                cancelled = mem.cancelled_at.get(drain)
                if cancelled is not None and time.monotonic() - cancelled < CANCEL_GRACE:
                    continue  # its runs are ending
                kill = cancelled is not None
                try:
                    ended = await op.restate.end_pinned(version.restate_deployment_id, kill=kill)
                except RestateError as error:  # removed only once none is left behind
                    mem.restate_problem = Verdict(DRAINING, True, error.reason, str(error))
                    continue
                if not kill:
                    mem.cancelled_at[drain] = time.monotonic()
                    kopf.warn(
                        body,
                        reason="DrainTimeout",
                        message=f"{why}: cancelling them (killed after {CANCEL_GRACE:.0f}s)",
                    )
                    continue
                why += f"; killed the {ended} left after cancelling them"
            await retire(op, body, version, why, warning=True)
            del versions[version.hash]
    for digest, version in list(versions.items()):
        pinned = in_flight.pinned.get(version.restate_deployment_id or "", 0)
        if pinned != version.in_flight:
            versions[digest] = version.model_copy(update={"in_flight": pinned})
    return in_flight


async def repair_children(
    op: Operator,
    body: kopf.Body,
    agent: DurableAgent,
    mem: AgentMemory,
    desired: str,
    available: dict[str, bool],
    sidecar_found: bool,
) -> None:
    """Apply the current version's objects and the sidecar's again if the version's Deployment
    or the sidecar's vanished (deleted by hand)."""
    settled = time.monotonic() - mem.applied_at > REPAIR_AFTER
    missing = desired not in available or not sidecar_found
    if mem.applied != desired or not missing or mem.blocker is not None or not settled:
        return
    try:
        _, mem.urls[desired] = await children.apply_version(op.kube, op.settings, body, agent)
    except KubeError as error:
        log.warning("re-applying version %s of %s failed: %s", desired, agent.metadata.name, error)
        return
    mem.applied_at = time.monotonic()
    what = f"version {desired}'s" if desired not in available else "the sidecar's"
    kopf.warn(body, reason="Repaired", message=f"{what} objects were missing")


# ------------------------------------------------------------------------------------------
# Status


def _verdicts(
    mem: AgentMemory,
    versions: Versions,
    desired: str,
    available: dict[str, bool],
    drain_timeout: str,
    sidecar: SidecarStatus | None,
) -> list[Verdict]:
    target = versions.get(desired)
    live = target is not None and target.state == "Active" and bool(target.restate_deployment_id)
    problem = mem.blocker or mem.registration_problem
    if live:
        assert target is not None
        registered = Verdict(
            REGISTERED,
            True,
            "Registered",
            f"version {desired} is Restate deployment {target.restate_deployment_id}",
        )
    elif problem is not None:
        registered = Verdict(REGISTERED, False, problem.reason, problem.message)
    elif (sidecar is None or not sidecar.restate_deployment_id) and (
        SIDECAR_VERSION in mem.unanswered_since
    ):
        registered = Verdict(
            REGISTERED,
            False,
            "WaitingForService",
            "the agent's sidecar has ready pods, but its URL does not answer yet",
        )
    elif sidecar is None or not sidecar.restate_deployment_id:
        registered = Verdict(
            REGISTERED,
            False,
            "WaitingForSidecar",
            "the agent's sidecar is not registered yet (its pods are not available, or its URL "
            "does not answer); versions are registered after it",
        )
    elif target is not None and not available.get(desired):
        registered = Verdict(
            REGISTERED, False, "WaitingForPods", f"version {desired} has no available pods yet"
        )
    elif desired in mem.unanswered_since:
        registered = Verdict(
            REGISTERED,
            False,
            "WaitingForService",
            f"version {desired} has ready pods, but its URL does not answer yet",
        )
    else:
        registered = Verdict(REGISTERED, False, "Registering", f"registering version {desired}")

    # A version at zero replicas takes new runs too: the first one wakes it (`scaling`).
    serving = [
        v
        for v in versions.values()
        if v.state == "Active"
        and v.restate_deployment_id
        and (available.get(v.hash) or v.scaled_to_zero_at)
    ]
    if serving:
        asleep = " (at zero replicas: a new run wakes it)" if serving[0].scaled_to_zero_at else ""
        ready = Verdict(
            READY, True, "VersionActive", f"version {serving[0].hash} takes new runs{asleep}"
        )
    else:
        ready = Verdict(READY, False, registered.reason, registered.message)

    if live:
        progressing = Verdict(PROGRESSING, False, "RolloutComplete", f"version {desired} is active")
    elif mem.blocker is not None:
        progressing = Verdict(PROGRESSING, False, mem.blocker.reason, mem.blocker.message)
    else:
        progressing = Verdict(PROGRESSING, True, "RollingOut", f"rolling out version {desired}")

    draining = sorted((v for v in versions.values() if v.state == "Draining"), key=lambda v: v.hash)
    if mem.restate_problem is not None and draining:
        drain = Verdict(DRAINING, True, mem.restate_problem.reason, mem.restate_problem.message)
    elif draining:
        parts = []
        for v in draining:
            asleep = ", at zero replicas" if v.scaled_to_zero_at else ""
            parts.append(f"{v.hash} ({v.in_flight} runs pinned{asleep})")
        waits = ", ".join(parts)
        drain = Verdict(
            DRAINING,
            True,
            "WaitingForRuns",
            f"draining {waits}; each goes when its runs finish, at the latest after "
            f"drain.timeout ({drain_timeout})",
        )
    else:
        drain = Verdict(DRAINING, False, "NothingToDrain", "no version is draining")
    return [ready, registered, progressing, drain]


def _phase(verdicts: list[Verdict], mem: AgentMemory) -> str:
    by_type = {v.type: v for v in verdicts}
    if mem.blocker is not None or mem.registration_problem is not None:
        return "Degraded"
    if by_type[READY].ok and not by_type[PROGRESSING].ok:
        return "Ready"
    return "Progressing"


async def assemble_status(
    op: Operator,
    body: kopf.Body,
    mem: AgentMemory,
    versions: Versions,
    desired: str,
    available: dict[str, bool],
    drain_timeout: str,
    sidecar: SidecarStatus | None,
) -> DurableAgentStatus:
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    previous = base_status(body, mem)
    verdicts = _verdicts(mem, versions, desired, available, drain_timeout, sidecar)
    try:
        parked = await op.observer.parked_calls(name)
    except RestateError:
        parked = previous.parked_calls
    ordered = sorted(versions.values(), key=lambda v: (v.created_at or "", v.hash), reverse=True)
    ready = sum(
        1
        for v in ordered
        if v.state in ("Active", "Draining") and v.restate_deployment_id and available.get(v.hash)
    )
    active = next((v.hash for v in ordered if v.state == "Active"), None)
    return DurableAgentStatus(
        phase=_phase(verdicts, mem),  # type: ignore[arg-type]
        observed_generation=meta.get("generation"),
        conditions=merge(previous.conditions, verdicts, meta.get("generation")),
        versions=ordered,
        active_version=active,
        ready_versions=f"{ready}/{len(ordered)}",
        endpoint=f"{op.settings.public_ingress_url}/{name}/{{session}}/run",
        webhook_url=render.sidecar_url(op.settings, name, namespace),
        parked_calls=parked,
        sidecar=sidecar,
    )


# ------------------------------------------------------------------------------------------
# The pass


async def converge(
    op: Operator,
    body: kopf.Body,
    mem: AgentMemory,
    deployments: list[children.WorkerDeployment],
) -> None:
    """One supervision pass over the agent's Deployments, its sidecar's among them (callers
    hold `mem.lock`)."""
    op.last_pass = time.monotonic()
    meta = body["metadata"]
    sidecar_pods = next((d for d in deployments if d.hash == SIDECAR_VERSION), None)
    deployments = [d for d in deployments if d.hash != SIDECAR_VERSION]
    previous = base_status(body, mem)
    try:
        agent = parse(body)
    except SpecError as error:
        invalid = Verdict(READY, False, "InvalidSpec", str(error))
        status = previous.model_copy(
            update={
                "phase": "Degraded",
                "conditions": merge(previous.conditions, [invalid], None),
            }
        )
        await write_status(op, body, mem, status)
        return
    desired = render.version_hash(agent, meta["namespace"], op.settings)
    versions: Versions = {v.hash: v for v in previous.versions}
    available = {d.hash: d.available for d in deployments}
    _adopt_deployments(versions, deployments, desired)
    if not mem.synced:
        try:
            await sync_once(op, body, mem, versions, desired)
        except RestateError as error:
            mem.restate_problem = Verdict(DRAINING, False, error.reason, str(error))
    if desired not in versions and mem.blocker is None and mem.applied == desired:
        versions[desired] = VersionStatus(hash=desired, state="Pending", created_at=now_rfc3339())
    await repair_children(op, body, agent, mem, desired, available, sidecar_pods is not None)
    sidecar = await register_sidecar(op, body, mem, agent, sidecar_pods)
    # A version's runs send to the sidecar's index: no version is registered before it.
    if desired in versions and sidecar is not None and sidecar.restate_deployment_id:
        await register_desired(op, body, mem, versions, desired, available)
    kept, ran_now = previous.schedules, previous.run_now
    # A schedule's runs go to the agent's object, and it is served by the index: both first.
    if any(v.state == "Active" and v.restate_deployment_id for v in versions.values()):
        kept = await schedules.observed(op, agent, await schedules.keep(op, body, mem, agent, kept))
        ran_now = await schedules.run_now(op, body, mem, agent, ran_now)
    in_flight = None
    try:
        in_flight = await drain_old(op, body, agent, mem, versions, desired)
    except RestateError as error:  # unregistering failed: keep the version, try again
        mem.warn_once(body, error.reason, str(error))
    except KubeError as error:
        log.warning("deleting an old version of %s failed: %s", meta["name"], error)
    if in_flight is not None:  # nothing is scaled on counts Restate did not give
        await scaling.scale(op, body, agent, mem, versions, desired, deployments, in_flight)
    status = await assemble_status(
        op, body, mem, versions, desired, available, agent.spec.drain.timeout, sidecar
    )
    counted = await spend.observed(op, agent, previous.spend)
    status = status.model_copy(update={"schedules": kept, "spend": counted, "run_now": ran_now})
    # The gauges first: whoever reads the status then finds them as it says.
    metrics.report(meta["namespace"], meta["name"], status.versions, mem.gauges)
    metrics.report_schedules(meta["namespace"], meta["name"], kept, mem.schedule_gauges)
    metrics.report_spend(meta["namespace"], meta["name"], counted, mem.spend_gauges)
    await write_status(op, body, mem, status)
