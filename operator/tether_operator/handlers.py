"""The kopf handlers: start-up settings, rollout on create/update/resume, supervision timer,
finalizer on delete, the Deployment index, the liveness probe and, with peering, the step-down
of a replica that another one paused."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import kopf

from tether.programs.redact import install as install_redaction
from tether.spec import SpecError

from . import children, deletion, metrics, peering, render, supervisor
from .conditions import PROGRESSING, Verdict
from .context import AgentMemory, Operator, memory_of, operator_of
from .kube import Kube, KubeError
from .names import (
    AGENT_LABEL,
    ANNOTATION_PREFIX,
    COMPONENT_LABEL,
    FIELD_MANAGER,
    FINALIZER,
    GROUP,
    MANAGED_BY_LABEL,
    PLURAL,
    SIDECAR_VERSION,
    VERSION,
    VERSION_LABEL,
)
from .restate_admin import RestateAdmin, RestateIngress, RestateObserver
from .settings import settings_from_env

#: Seconds between supervision passes of one agent (read at import: kopf fixes timer intervals).
RECONCILE_INTERVAL = float(os.environ.get("TETHER_RECONCILE_INTERVAL") or 1.0)
MCP_EGRESS_REFRESH = float(os.environ.get("TETHER_MCP_EGRESS_REFRESH") or 30.0)
"""Seconds between lookups of the Services of an agent's in-cluster MCP servers."""
MAX_BACKOFF = 30.0


class QuietRoutine(logging.Filter):
    """Drop kopf's success lines of the routine handlers (one per agent per interval, one per
    Deployment event); failures and the rollout and delete handlers stay in the log."""

    ROUTINE = (
        "Timer 'supervise' succeeded",
        "Handler 'deployment_changed' succeeded",
        "Daemon 'step_down_when_paused' succeeded",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.ROUTINE)


def backoff(retry: int) -> float:
    """1 s, 2 s, 4 s ... 30 s between attempts of a failing handler."""
    return float(min(2**retry, MAX_BACKOFF))


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    install_redaction()  # also under `kopf run -m tether_operator` (main() does it sooner)
    ours = settings_from_env()
    logging.getLogger("kopf.objects").addFilter(QuietRoutine())
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    settings.posting.loggers = False  # events are the explicit ones, not every log line
    settings.scanning.disabled = True  # watch what --namespace/-A says; no cluster-wide scans
    settings.networking.request_timeout = 60.0
    settings.watching.server_timeout = 300
    settings.execution.max_workers = 4
    peered = peering.configure(settings, ours)
    guard = peering.LEASE.check if peered else None
    kube = Kube(guard=guard)
    if peered:
        try:
            await peering.wait_for_objects(kube, ours, settings.peering.clusterwide)
        except BaseException:
            await kube.close()
            raise
    metrics.serve(ours.metrics_port)
    admin = RestateAdmin(ours.restate_admin_url, ours.restate_timeout, guard=guard)
    memo.operator = Operator(
        settings=ours,
        kube=kube,
        restate=admin,
        observer=RestateObserver(admin, in_flight_age=1.0, parked_age=ours.parked_refresh),
        ingress=RestateIngress(ours.restate_ingress_url, ours.restate_timeout, guard=guard),
    )


@kopf.on.cleanup()
async def close_clients(memo: kopf.Memo, **_: Any) -> None:
    if "operator" in memo:
        await operator_of(memo).close()


@kopf.on.probe(id="lastSupervisionSecondsAgo")
def last_pass(memo: kopf.Memo, **_: Any) -> float:
    """Seconds since any agent was last supervised: a stalled watch shows up as a large value."""
    if "operator" not in memo:
        return 0.0
    return round(time.monotonic() - operator_of(memo).last_pass, 1)


@kopf.index("apps", "v1", "deployments", labels={MANAGED_BY_LABEL: FIELD_MANAGER})
def worker_deployments(
    namespace: str | None,
    name: str,
    labels: kopf.Labels,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    **_: Any,
) -> dict[tuple[str, str], children.WorkerDeployment]:
    """The version Deployments by (namespace, agent), with their availability; the agent's
    sidecar Deployment among them, as the version `SIDECAR_VERSION`."""
    agent, digest = labels.get(AGENT_LABEL), labels.get(VERSION_LABEL)
    if labels.get(COMPONENT_LABEL) == "sidecar":
        digest = SIDECAR_VERSION
    if not agent or not digest:
        return {}
    found = children.observed(digest, name, dict(spec), dict(status), dict(meta))
    return {(namespace or "", agent): found}


def _deployments_of(
    kwargs: dict[str, Any], namespace: str | None, name: str
) -> list[children.WorkerDeployment]:
    """This agent's entries of the `worker_deployments` index (kopf passes it by name)."""
    index: kopf.Index[tuple[str, str], children.WorkerDeployment] = kwargs["worker_deployments"]
    return list(index.get((namespace or "", name), []))


@kopf.on.event("apps", "v1", "deployments", labels={MANAGED_BY_LABEL: FIELD_MANAGER})
async def deployment_changed(
    namespace: str | None,
    labels: kopf.Labels,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    memo: kopf.Memo,
    **kwargs: Any,
) -> None:
    """A version's Deployment became available: supervise its agent now, not at the next tick."""
    agent, digest = labels.get(AGENT_LABEL), labels.get(VERSION_LABEL)
    if "operator" not in memo or not agent or not digest:
        return
    if not children.is_available(dict(spec), dict(status), int(meta.get("generation", 0))):
        return
    op = operator_of(memo)
    known = op.agents.get((namespace or "", agent))
    if known is None:
        return
    mem, body = known
    versions = mem.status.versions if mem.status is not None else []
    if any(v.hash == digest and v.state == "Active" for v in versions):
        return
    async with mem.lock:
        await supervisor.converge(op, body, mem, _deployments_of(kwargs, namespace, agent))


async def report_blocker(
    op: Operator,
    body: kopf.Body,
    mem: AgentMemory,
    deployments: list[children.WorkerDeployment],
    reason: str,
    message: str,
) -> None:
    """Say why the spec cannot roll out: a condition and one Warning event."""
    mem.blocker = Verdict(PROGRESSING, False, reason, message)
    mem.warn_once(body, reason, message)
    await supervisor.converge(op, body, mem, deployments)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def rollout(
    body: kopf.Body, namespace: str | None, retry: int, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Apply the objects of the spec's version; the supervision timer registers it."""
    if body["metadata"].get("deletionTimestamp"):
        return
    op, mem = operator_of(memo), memory_of(memo)
    op.agents[(namespace or "", body["metadata"]["name"])] = (mem, body)
    try:
        agent = supervisor.parse(body)
    except SpecError as error:
        raise kopf.PermanentError(f"the spec cannot be served: {error}") from None
    async with mem.lock:
        deployments = _deployments_of(kwargs, namespace, agent.metadata.name)
        problem: tuple[str, str] | None = None
        digest = url = ""
        try:
            missing = await children.missing_secrets(op.kube, agent, namespace or "")
            if missing:
                problem = ("SecretNotFound", "; ".join(missing))
            else:
                digest, url = await children.apply_version(op.kube, op.settings, body, agent)
        except KubeError as error:
            problem = ("ApplyFailed", str(error))
        if problem is not None:
            await report_blocker(op, body, mem, deployments, *problem)
            delay = backoff(retry)
            raise kopf.TemporaryError(f"{problem[1]} (trying again in {delay:.0f}s)", delay=delay)
        if mem.blocker is not None:
            mem.blocker = None
            mem.warned.clear()
        mem.urls[digest] = url
        if mem.applied != digest:
            known = {v.hash for v in supervisor.base_status(body, mem).versions}
            if digest not in known:
                kopf.info(body, reason="VersionDeployed", message=f"version {digest} applied")
        mem.applied, mem.applied_at = digest, time.monotonic()
        await supervisor.converge(
            op, body, mem, _deployments_of(kwargs, namespace, agent.metadata.name)
        )


@kopf.timer(GROUP, VERSION, PLURAL, interval=RECONCILE_INTERVAL, backoff=RECONCILE_INTERVAL)
async def supervise(
    body: kopf.Body, namespace: str | None, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Register the current version when its pods are available, drain and retire old ones,
    and report it all in the status."""
    if body["metadata"].get("deletionTimestamp"):
        return
    op, mem = operator_of(memo), memory_of(memo)
    op.agents[(namespace or "", name)] = (mem, body)
    async with mem.lock:
        await supervisor.converge(op, body, mem, _deployments_of(kwargs, namespace, name))
        await _refresh_mcp_egress(op, body, mem)


async def _refresh_mcp_egress(op: Operator, body: kopf.Body, mem: AgentMemory) -> None:
    """Every MCP_EGRESS_REFRESH seconds, the egress rules to the agent's in-cluster MCP servers
    follow their Services (one created after the agent, a changed selector or port)."""
    if mem.applied is None or time.monotonic() - mem.mcp_checked_at < MCP_EGRESS_REFRESH:
        return
    mem.mcp_checked_at = time.monotonic()
    try:
        agent = supervisor.parse(body)
    except SpecError:
        return
    in_cluster = any(entry.mcp is not None and entry.mcp.url for entry in agent.spec.tools)
    if not in_cluster and render.otlp_endpoint(agent, op.settings) is None:
        return
    try:
        mem.mcp_rules = await children.refresh_egress(
            op.kube, op.settings, body, agent, mem.mcp_rules
        )
    except KubeError as error:
        logging.getLogger(__name__).warning(
            "refreshing the egress policy of %s failed: %s", agent.metadata.name, error
        )


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=1.0)
async def step_down_when_paused(stopped: kopf.DaemonStopped, **_: Any) -> None:
    """kopf stops every daemon when peering pauses this replica: one that has acted on an agent
    (this daemon runs while it does) then exits rather than resume on stale memory
    (`peering.py`). Standalone, it only waits."""
    await stopped.wait()
    if peering.paused(stopped):
        peering.step_down()


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def finalize(body: kopf.Body, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Drain every version (bounded by drain.timeout), unregister it, delete its objects."""
    op, mem = operator_of(memo), memory_of(memo)
    op.agents.pop((namespace or "", body["metadata"]["name"]), None)
    async with mem.lock:
        await deletion.drain_before_delete(op, body, mem)
