"""Autoscaling and scale to zero: a version has as many worker pods as its active runs need,
none while its runs only wait, and they come back as soon as one of them has work again.

Every supervision pass reads Restate's one cached count of unfinished invocations by deployment
and status (`RestateObserver.in_flight`), and for each version:

- records its active runs (running, ready, backing off) and parked ones (suspended,
  paused) in the status (and so in the gauges, `metrics`). The active version's also count the
  invocations of the agent's object that no deployment has yet: Restate sends a new run (or a
  read of a session) to its latest deployment, and pins it there only once a worker answers
  (what every version's runs share, the inboxes, the index, is served by the sidecar's pods);
- a version with no active run for `spec.scaling.idleAfter` goes to 0 replicas (unless it has
  paused runs: they would wake it at once), the active one too: the agent's sidecar, a
  Deployment of its own, takes the webhooks and keeps the index of parked calls meanwhile. It
  stays registered with Restate, which keeps its runs pinned to it;
- a version at zero is scaled back to the replicas it had (within `minReplicas` and
  `maxReplicas`) at once when one of its runs has work (an approval answered makes its run
  ready, a new run is pending; Restate cannot reach the version and backs off, at most 1 s
  between attempts for about an hour, then pauses the run), when it has paused runs (their
  retries ran out while nobody woke it), when it is the spec's version but not registered (a
  rollback: registration needs its pods) or when the agent no longer sets `idleAfter`. Its
  paused runs are resumed once it has pods;
- with `spec.scaling.activeRunsPerReplica`, a version with pods gets ceil(active runs / that)
  of them within `minReplicas` and `maxReplicas` (`autoscale`): more at once, fewer only once
  its runs have needed fewer for `scaleDownAfter`. A pod added under load gets runs because
  workers retire Restate's connections (`tether.programs.worker.connection_age`).

Who owns `spec.replicas`: the scaler applies `spec.replicas` alone (and two annotations: when,
and from how many) with a field manager of its own, `tether-operator-scale`. The version
objects' own apply (`children.apply_version`, field manager `tether-operator`) keeps the
Deployment's `spec.replicas` whenever another manager owns them (this scaler, or an HPA), so
applying the agent again neither wakes its active version nor undoes a scaler; on a rollback to
a version at zero, the scaler wakes it (it is the spec's version and not registered).
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import kopf

from tether.spec import (
    DurableAgent,
    ScalingSpec,
    VersionStatus,
    parse_duration,
    restate_services,
)

from .children import WorkerDeployment, observed
from .conditions import parse_rfc3339
from .context import AgentMemory, Operator
from .kube import Kube, KubeError
from .names import (
    REPLICAS_ANNOTATION,
    SCALE_FIELD_MANAGER,
    SCALED_TO_ZERO_ANNOTATION,
    version_name,
)
from .restate_admin import InFlight, RestateError, Runs

log = logging.getLogger("tether_operator")


@dataclass(frozen=True)
class Decision:
    """One version's scaling fields as they should be now, and whether to scale it."""

    version: VersionStatus
    replicas: int | None = None
    """Scale its Deployment to this many replicas now; None: leave it as it is."""
    reason: str = ""
    """The event's reason when it is scaled: ScaledToZero, WokeUp, ScaledUp or ScaledDown."""
    message: str = ""


def _runs_text(runs: Runs) -> str:
    return f"{runs.active + runs.paused} runs need it ({runs.active} active, {runs.paused} paused)"


def _wake_reason(runs: Runs, *, needed: bool, idle_after: float | None) -> str | None:
    """Why a version at zero must have pods again, if it must."""
    if needed:
        return "it is the spec's version, registered only once it has pods"
    if idle_after is None:
        return "spec.scaling.idleAfter is no longer set"
    if runs.active or runs.paused:
        return _runs_text(runs)
    return None


def decide(
    version: VersionStatus,
    runs: Runs,
    *,
    needed: bool,
    idle_after: float | None,
    deployment: WorkerDeployment,
    restore: int,
    now: float,
    hold: bool = False,
) -> Decision:
    """The idle rule for one version with a Deployment (see the module's docstring).

    `needed`: it must have pods whatever its runs say (the spec's version, not registered yet);
    `idle_after`: seconds, None when the agent does not scale to zero; `restore`: the replicas
    to wake it with; `hold`: keep it up whatever its runs say (it was woken, and its paused runs
    are not resumed yet)."""
    stamp = _stamp(now)
    counts: dict[str, Any] = {"active_runs": runs.active, "parked_runs": runs.parked}
    watched = not needed and idle_after is not None
    if version.scaled_to_zero_at is not None:
        why = _wake_reason(runs, needed=needed, idle_after=idle_after)
        if why is None:
            return Decision(version.model_copy(update={**counts, "replicas": 0}))
        woken = version.model_copy(
            update={
                **counts,
                "replicas": restore,
                "scaled_to_zero_at": None,
                "woke_at": stamp,
                # Idle again only from now: a woken version stays up at least idleAfter.
                "idle_since": None if runs.active or not watched else stamp,
            }
        )
        message = f"version {version.hash} scaled back to {restore} replicas: {why}"
        return Decision(woken, restore, "WokeUp", message)

    idle_since = None if runs.active or not watched else (version.idle_since or stamp)
    current = deployment.replicas
    awake = version.model_copy(update={**counts, "replicas": current, "idle_since": idle_since})
    # Paused runs need no worker, but they are a reason to wake (to resume them): a version
    # with any would be woken at once. And a version Restate does not know has no runs to see.
    unseen = version.restate_deployment_id is None
    if hold or idle_since is None or idle_after is None or current == 0 or runs.paused or unseen:
        return Decision(awake)
    idle = now - parse_rfc3339(idle_since)
    if idle < idle_after:
        return Decision(awake)
    asleep = awake.model_copy(update={"replicas": 0, "scaled_to_zero_at": stamp, "woke_at": None})
    message = (
        f"version {version.hash} scaled to zero replicas: no run of it has been active for "
        f"{idle:.0f}s (spec.scaling.idleAfter); its {runs.parked} parked runs wait in Restate, "
        "which keeps it registered, and wake it when one has work"
    )
    return Decision(asleep, 0, "ScaledToZero", message)


def autoscale(
    version: VersionStatus,
    runs: Runs,
    *,
    scaling: ScalingSpec,
    current: int,
    recommended: list[tuple[float, int]],
    now: float,
) -> Decision:
    """The autoscaling rule for a version with pods: the replicas its active runs need now
    (`ScalingSpec.autoscaled`) at once if more than it has, else the most they needed within
    scaleDownAfter. `recommended` holds that window's needs, oldest first, each lower than the
    one before (an older need no higher than a newer one can no longer be the most: at most
    maxReplicas entries, however long the window); it is updated here. A new one starts with
    the replicas the version has, so an operator that just took over waits a whole window
    before it takes any pod away."""
    needed = scaling.autoscaled(runs.active)
    if not recommended:
        recommended.append((now, current))
    while recommended and recommended[-1][1] <= needed:
        recommended.pop()
    recommended.append((now, needed))
    window = parse_duration(scaling.scale_down_after)
    while now - recommended[0][0] > window:
        recommended.pop(0)
    target = recommended[0][1]
    if target == current:
        return Decision(version)
    why = (
        f"{runs.active} active runs, {scaling.active_runs_per_replica} per replica "
        "(spec.scaling.activeRunsPerReplica)"
    )
    if target < current:
        why += f", for at least {scaling.scale_down_after} (spec.scaling.scaleDownAfter)"
    reason = "ScaledUp" if target > current else "ScaledDown"
    message = f"version {version.hash} scaled from {current} to {target} replicas: {why}"
    return Decision(version.model_copy(update={"replicas": target}), target, reason, message)


def _stamp(epoch: float) -> str:
    """RFC 3339 with milliseconds: an idle period of a few seconds is measured, not rounded."""
    moment = datetime.datetime.fromtimestamp(epoch, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def idle_after(agent: DurableAgent) -> float | None:
    scaling = agent.spec.scaling
    if scaling is None or scaling.idle_after is None:
        return None
    return parse_duration(scaling.idle_after)


def restore_replicas(agent: DurableAgent, before: int | None) -> int:
    """The replicas to wake a version with: those it had (else `worker.replicas`), at least 1,
    within the agent's minReplicas and maxReplicas."""
    replicas = before if before is not None else agent.spec.worker.replicas
    scaling = agent.spec.scaling
    return scaling.bounded(replicas) if scaling is not None else max(replicas, 1)


async def apply_replicas(
    kube: Kube, namespace: str, name: str, replicas: int, before: int = 0, at: str = ""
) -> None:
    """Apply `spec.replicas` alone, as the scale field manager; at zero with annotations saying
    when and from how many (gone again when it is scaled back: the manager no longer sends
    them)."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if replicas == 0:
        metadata["annotations"] = {SCALED_TO_ZERO_ANNOTATION: at, REPLICAS_ANNOTATION: str(before)}
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {"replicas": replicas},
    }
    await kube.apply(manifest, field_manager=SCALE_FIELD_MANAGER)


def restore_memory(
    mem: AgentMemory, versions: dict[str, VersionStatus], by_hash: dict[str, WorkerDeployment]
) -> None:
    """After a (re)start: versions woken before may have paused runs to resume, and a version
    the status does not know at zero is taken from its Deployment's annotation."""
    for digest, version in list(versions.items()):
        deployment = by_hash.get(digest)
        if (
            deployment is not None
            and deployment.replicas == 0
            and version.scaled_to_zero_at is None
        ):
            found = deployment.scaled_to_zero_at
            if found:
                versions[digest] = version.model_copy(update={"scaled_to_zero_at": found})
        elif version.woke_at is not None and version.scaled_to_zero_at is None:
            mem.resume_due.add(digest)
    mem.scaling_restored = True


async def scale(
    op: Operator,
    body: kopf.Body,
    agent: DurableAgent,
    mem: AgentMemory,
    versions: dict[str, VersionStatus],
    desired: str,
    deployments: list[WorkerDeployment],
    in_flight: InFlight,
) -> None:
    """One pass of the scaler over the agent's versions (updates `versions` in place)."""
    namespace = body["metadata"]["namespace"]
    by_hash = {d.hash: d for d in deployments}
    if not mem.scaling_restored:
        restore_memory(mem, versions, by_hash)
    seconds = idle_after(agent)
    scaling = agent.spec.scaling
    autoscaled = scaling if scaling is not None and scaling.active_runs_per_replica else None
    now = time.time()
    for digest, version in list(versions.items()):
        runs = runs_of(agent.metadata.name, version, in_flight)
        deployment = by_hash.get(digest)
        if deployment is None:  # nothing to scale (yet, or any more): the counts only
            counts = {"active_runs": runs.active, "parked_runs": runs.parked}
            versions[digest] = version.model_copy(update=counts)
            continue
        needed = digest == desired and version.state != "Active"
        # The spec's version, woken by a rollback, gets the spec's replicas (as its apply does).
        before = None if needed else deployment.replicas_before_zero

        decided = functools.partial(
            decide,
            version,
            needed=needed,
            idle_after=seconds,
            deployment=deployment,
            restore=restore_replicas(agent, before),
            now=now,
            hold=digest in mem.resume_due,
        )
        decision = decided(runs)
        if decision.replicas == 0:
            # The counts may be seconds old: a run started since would lose its pod mid-call.
            try:
                in_flight = await op.observer.in_flight(max_age=0.0)
            except RestateError as error:
                log.warning("counting the runs of %s again failed: %s", digest, error)
                continue
            runs = runs_of(agent.metadata.name, version, in_flight)
            decision = decided(runs)
        if autoscaled and decision.replicas is None and not needed and deployment.replicas:
            decision = autoscale(
                decision.version,
                runs,
                scaling=autoscaled,
                current=deployment.replicas,
                recommended=mem.recommended.setdefault(digest, []),
                now=now,
            )
        else:  # at zero, woken or not yet its own: a new window once it autoscales again
            mem.recommended.pop(digest, None)
        if decision.replicas is not None:
            try:
                await apply_replicas(
                    op.kube,
                    namespace,
                    deployment.name,
                    decision.replicas,
                    before=deployment.replicas,
                    at=decision.version.scaled_to_zero_at or "",
                )
            except KubeError as error:
                log.warning("scaling %s failed: %s", deployment.name, error)
                continue
            kopf.info(body, reason=decision.reason, message=decision.message)
            if decision.replicas:
                mem.resume_due.add(digest)
            else:
                mem.resume_due.discard(digest)
        versions[digest] = decision.version
    await _resume_woken(op, body, agent, mem, versions, by_hash)


def runs_of(agent: str, version: VersionStatus, in_flight: InFlight) -> Runs:
    """The runs that need the version: pinned to it, and for the active version those no
    deployment has yet (Restate sends them to the latest)."""
    runs = in_flight.runs(version.restate_deployment_id)
    if version.state == "Active":
        runs += in_flight.starting(restate_services(agent).of_versions)
    return runs


async def _resume_woken(
    op: Operator,
    body: kopf.Body,
    agent: DurableAgent,
    mem: AgentMemory,
    versions: dict[str, VersionStatus],
    by_hash: dict[str, WorkerDeployment],
) -> None:
    """Resume the paused runs of each version woken from zero, once it has available pods."""
    for digest in list(mem.resume_due):
        version, deployment = versions.get(digest), by_hash.get(digest)
        if version is None or version.scaled_to_zero_at is not None:
            mem.resume_due.discard(digest)
            continue
        if deployment is None or not deployment.available:
            continue
        if version.restate_deployment_id:
            active = version.state == "Active"
            services = restate_services(agent.metadata.name).of_versions if active else ()
            try:
                resumed = await op.restate.resume_paused(version.restate_deployment_id, services)
            except RestateError as error:
                log.warning("resuming the paused runs of %s failed: %s", digest, error)
                continue
            if resumed:
                kopf.info(
                    body,
                    reason="Resumed",
                    message=f"{resumed} paused runs of version {digest} resumed: it has pods",
                )
        mem.resume_due.discard(digest)


async def wake_for_deletion(
    op: Operator,
    body: kopf.Body,
    agent: DurableAgent | None,
    versions: list[VersionStatus],
    in_flight: InFlight,
) -> list[VersionStatus]:
    """While the agent is deleted (its finalizer waits for the runs in flight, and the
    supervision pass no longer runs): scale back up each version at zero whose runs need it,
    and resume the paused runs of a woken version once it has pods. The versions, updated."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    updated = []
    for version in versions:
        runs = runs_of(name, version, in_flight)
        asleep = version.scaled_to_zero_at is not None
        wanted = (asleep and (runs.active or runs.paused)) or (runs.paused and version.woke_at)
        found = None
        if wanted:
            object_name = version_name(name, version.hash)
            found = await op.kube.get("apps/v1", "Deployment", namespace, object_name)
        if found is None:
            updated.append(version)
            continue
        seen = observed(
            version.hash, object_name, found["spec"], found.get("status") or {}, found["metadata"]
        )
        if not asleep:
            if seen.available and version.restate_deployment_id:
                with contextlib.suppress(RestateError):  # asked again at the next poll
                    await op.restate.resume_paused(version.restate_deployment_id)
            updated.append(version)
            continue
        previous = seen.replicas_before_zero
        replicas = restore_replicas(agent, previous) if agent is not None else previous or 1
        await apply_replicas(op.kube, namespace, object_name, replicas)
        message = f"version {version.hash} scaled back to {replicas} replicas: {_runs_text(runs)}"
        kopf.info(body, reason="WokeUp", message=message)
        woken = {"scaled_to_zero_at": None, "woke_at": _stamp(time.time()), "replicas": replicas}
        updated.append(version.model_copy(update=woken))
    return updated
