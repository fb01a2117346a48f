"""High availability: several replicas of the operator, one of which acts at a time (kopf's
peering).

With `TETHER_PEERING=<name>` every replica writes a keep-alive record (its priority, lifetime and
last-seen time) into the status of kopf's peering object `<name>`: the ClusterKopfPeering when the
operator watches all namespaces, the KopfPeering of that name in each watched namespace
otherwise. kopf pauses ("freezes") a replica while another one with a higher priority has a
fresh record: its watches and timers stop. The others resume when that record goes stale
(`lifetime` seconds after its last keep-alive, at most `TETHER_PEERING_LIFETIME`, 15 s) or is
removed (a replica that stops cleanly removes its own record: the next one takes over at once).

Choices made here, on top of kopf's mechanism:

- Peering is mandatory once named: a replica starts paused and acts only after it has seen the
  peering object and no live replica above it (kopf would otherwise act until its first look).
  The object must exist (the chart creates it); start-up waits for it, then fails, rather than
  run paused for ever.
- The oldest replica leads: the priority falls with the process's start time (microseconds), so
  a replica that starts or restarts never takes over from one that runs, and a rolling update
  moves the lead once, when the old leader stops. Two replicas of the same priority would both
  pause (kopf's rule), so priorities are distinct; `TETHER_PEERING_PRIORITY` overrides, and
  `kopf freeze` (priority 100) pauses all replicas, for maintenance.
- A replica that has acted and is then paused steps down: it exits (Kubernetes starts it again,
  as the youngest, a standby). Its memory of the agents (the status it last wrote, what it
  applied) and kopf's index of the Deployments would be stale by the time it resumed, and
  starting afresh is the crash recovery every pass is built for (`supervisor.sync_once`).

Peering alone is not a lock: a leader that stalls (or loses the API server) for longer than the
margin between its keep-alives and their expiry (5 to 10 s) is taken for dead, and kopf would let
it lead again when it comes back (it is older) from a memory that misses what the other did. So
each replica also holds a lease of its own keep-alives (`lease.py`): one whose keep-alives lapsed
sends no more of them and no write, and steps down, and the replica that led meanwhile goes on.
Its keep-alives are fenced by the object's `resourceVersion` (`fenced_keep_alive`), so one that
lands late, after a network partition, cannot bring its record back to life.
Every step is idempotent and re-checked against Restate and the cluster besides (registering a
URL again keeps its deployment, unregistering or deleting what is gone is a no-op, a version is
retired only on a fresh count of zero runs). The clocks of the nodes must agree (NTP): a
record's expiry is read on another node.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from typing import Any

import kopf
from kopf._cogs.clients import api as kopf_api
from kopf._cogs.clients import errors as kopf_errors
from kopf._cogs.structs import references as kopf_references
from kopf._core.engines import peering as kopf_peering

from .kube import Kube, KubeError
from .lease import Lease
from .settings import OperatorSettings

log = logging.getLogger("tether_operator")

GROUP = "kopf.dev"
VERSION = "v1"
STARTED_AT_US = time.time_ns() // 1000
"""When this process started (imported the operator), in microseconds: its default priority is
the negative of it, so the oldest replica has the highest."""
OBJECT_WAIT = 60.0
"""Seconds start-up waits for the peering object(s) to exist before it gives up."""
HARD_EXIT_AFTER = 20.0
"""Seconds a replica that steps down is given to stop cleanly before it is ended."""

_stepping_down = False

LEASE = Lease()
"""This process's lease (`lease.py`), held once peering is configured."""


def priority(ours: OperatorSettings) -> int:
    return ours.peering_priority if ours.peering_priority is not None else -STARTED_AT_US


def configure(settings: kopf.OperatorSettings, ours: OperatorSettings) -> bool:
    """Set kopf's peering from `TETHER_PEERING*` (they win over kopf's own flags); False when
    standalone (then kopf's settings stay as its flags made them)."""
    if ours.peering is None:
        return False
    settings.peering.standalone = False
    settings.peering.mandatory = True
    settings.peering.name = ours.peering
    settings.peering.lifetime = ours.peering_lifetime
    settings.peering.priority = priority(ours)
    settings.peering.stealth = True  # no log line per keep-alive
    LEASE.hold(ours.peering_lifetime, step_down)
    _renew_through_the_lease()
    log.info(
        "peering %r: priority %d, lifetime %ds; this replica acts while no live replica has a "
        "higher priority",
        ours.peering,
        settings.peering.priority,
        ours.peering_lifetime,
    )
    return True


def _renew_through_the_lease() -> None:
    """Route kopf's keep-alives (`touch`, which its peering engine looks up at each call) through
    `LEASE.renew`, fenced (`fenced_keep_alive`): a lapsed lease sends none, and each one that
    goes through in time renews it. kopf is pinned to a minor version (pyproject.toml) for this
    hook and the internals `fenced_keep_alive` uses."""
    touch = getattr(kopf_peering, "_tether_kopf_touch", kopf_peering.touch)

    async def renewing_touch(*, lifetime: int | None = None, **kwargs: Any) -> None:
        if lifetime == 0:  # removing its record, as it stops
            await touch(lifetime=lifetime, **kwargs)
            return
        await LEASE.renew(lambda: fenced_keep_alive(**kwargs))

    kopf_peering._tether_kopf_touch = touch  # type: ignore[attr-defined]
    kopf_peering.touch = renewing_touch


async def fenced_keep_alive(
    *,
    identity: kopf_peering.Identity,
    settings: kopf.OperatorSettings,
    resource: kopf_references.Resource,
    namespace: kopf_references.Namespace,
) -> None:
    """kopf's keep-alive (this replica's record, fresh), on the condition that the peering
    object is still at the version read just before it.

    The lease cancels a keep-alive still going when it lapses, but a request already written to
    a connection the network has lost goes on: the kernel retransmits it, and it can land once the
    network is back, bringing the record back to life after another replica took over (which then
    steps down for it). A replica takes over only after it has written to the object itself (kopf
    touches its own record once the leader's has expired, then removes the dead one), and this
    keep-alive's read came before its lease lapsed, so before that expiry: landing late, it is
    refused (409 Conflict). A conflict while the lease holds is another replica's keep-alive in
    between: read again and retry."""
    name = settings.peering.name
    url = resource.get_url(namespace=namespace, name=name)
    # Read by listing it: the operator may list its kind (RBAC), not get.
    listing = resource.get_url(
        namespace=namespace, params={"fieldSelector": f"metadata.name={name}"}
    )
    peer = kopf_peering.Peer(
        identity=identity, priority=settings.peering.priority, lifetime=settings.peering.lifetime
    )
    while True:
        try:
            found = (await kopf_api.get(listing, settings=settings, logger=log))["items"]
            if not found:
                return  # as kopf's own: nothing to keep alive in
            fence = found[0]["metadata"]["resourceVersion"]
            await kopf_api.patch(
                url,
                settings=settings,
                logger=log,
                headers={"Content-Type": "application/merge-patch+json"},
                payload={
                    "metadata": {"resourceVersion": fence},
                    "status": {identity: peer.as_dict()},
                },
            )
            return
        except kopf_errors.APIConflictError:
            continue
        except kopf_errors.APINotFoundError:
            return  # as kopf's own: nothing to keep alive in


def _path(namespace: str | None) -> str:
    if namespace is None:
        return f"/apis/{GROUP}/{VERSION}/clusterkopfpeerings"
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/kopfpeerings"


async def missing_objects(kube: Kube, name: str, namespaces: list[str | None]) -> list[str]:
    """The peering objects named `name` that do not exist (or whose kind is not served)."""
    missing = []
    for namespace in namespaces:
        kind = "ClusterKopfPeering" if namespace is None else f"KopfPeering in {namespace}"
        found = await kube.list_named(_path(namespace), name)
        if found is None:
            missing.append(f"{kind} {name} (its CRD is not installed: crds/kopfpeering.yaml)")
        elif not found:
            missing.append(f"{kind} {name}")
    return missing


async def wait_for_objects(kube: Kube, ours: OperatorSettings, clusterwide: bool) -> None:
    """Wait until the peering objects exist: a replica without one would stay paused, silently.
    Raise `kopf.PermanentError` (the operator exits) after `OBJECT_WAIT` seconds."""
    assert ours.peering is not None
    namespaces: list[str | None] = [None] if clusterwide else list(ours.namespaces)
    if not namespaces:
        log.warning(
            "peering %r: the watched namespaces are unknown (TETHER_NAMESPACES is empty), so "
            "their KopfPeering objects are not checked",
            ours.peering,
        )
        return
    deadline = time.monotonic() + OBJECT_WAIT
    warned = ""
    while True:
        try:
            missing = await missing_objects(kube, ours.peering, namespaces)
        except KubeError as error:
            if error.status in (401, 403):
                raise kopf.PermanentError(
                    f"peering: {error}; the operator needs list, watch and patch on kopf.dev's "
                    "peering objects (operator/rbac/clusterrole.yaml)"
                ) from None
            missing = [str(error)]
        if not missing:
            return
        problem = "; ".join(missing)
        if time.monotonic() >= deadline:
            raise kopf.PermanentError(
                f"peering: gave up after {OBJECT_WAIT:.0f}s waiting for {problem}; create it "
                "(the chart does), or unset TETHER_PEERING to run one replica standalone"
            )
        if problem != warned:
            log.warning("peering: waiting for %s", problem)
            warned = problem
        await asyncio.sleep(1.0)


def step_down(reason: str = "another replica of the operator leads now") -> None:
    """This replica was paused after it acted, or its lease lapsed: stop cleanly (kopf removes
    its peering record), and end for good after `HARD_EXIT_AFTER` seconds if stopping hangs."""
    global _stepping_down
    if _stepping_down:
        return
    _stepping_down = True
    log.warning(
        "%s: this replica exits, to start again as a standby that remembers nothing stale",
        reason,
    )
    timer = threading.Timer(HARD_EXIT_AFTER, os._exit, args=(1,))
    timer.daemon = True
    timer.start()
    os.kill(os.getpid(), signal.SIGTERM)


def paused(stopped: kopf.DaemonStopped) -> bool:
    """Whether kopf stopped a daemon because this replica was paused (peering)."""
    reason = stopped.reason
    return reason is not None and bool(reason & kopf.DaemonStoppingReason.OPERATOR_PAUSING)
