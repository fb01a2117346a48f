"""Applying, finding and deleting the Kubernetes objects of an agent's versions and its
sidecar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from tether.spec import DurableAgent

from . import render
from .kube import Kube
from .mcp_egress import mcp_egress_rules
from .names import (
    AGENT_LABEL,
    FIELD_MANAGER,
    REPLICAS_ANNOTATION,
    SCALED_TO_ZERO_ANNOTATION,
    SIDECAR_VERSION,
    VERSION_LABEL,
    WORKER_PORT,
    sidecar_name,
    version_name,
)
from .settings import OperatorSettings

Manifest = dict[str, Any]
KINDS = (
    ("apps/v1", "Deployment"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("policy/v1", "PodDisruptionBudget"),
)


@dataclass(frozen=True)
class WorkerDeployment:
    """A version's Deployment as the index sees it."""

    hash: str
    name: str
    available: bool
    replicas: int = 1
    """Its `spec.replicas`."""
    scaled_to_zero_at: str | None = None
    """When the operator scaled it to zero (its annotation), if it did."""
    replicas_before_zero: int | None = None
    """The replicas it had then, to scale it back to."""


def observed(
    digest: str, name: str, spec: Manifest, status: Manifest, meta: Manifest
) -> WorkerDeployment:
    """A version's Deployment as the index (or a read of it) sees it."""
    annotations = meta.get("annotations") or {}
    before = str(annotations.get(REPLICAS_ANNOTATION, ""))
    return WorkerDeployment(
        digest,
        name,
        is_available(spec, status, int(meta.get("generation", 0))),
        replicas=int(spec.get("replicas", 1)),
        scaled_to_zero_at=annotations.get(SCALED_TO_ZERO_ANNOTATION),
        replicas_before_zero=int(before) if before.isdigit() else None,
    )


def is_available(spec: dict[str, Any], status: dict[str, Any], generation: int) -> bool:
    wanted = int(spec.get("replicas", 1))
    if wanted < 1 or int(status.get("observedGeneration", 0)) < generation:
        return False
    return (
        int(status.get("availableReplicas", 0)) >= wanted
        and int(status.get("updatedReplicas", 0)) >= wanted
    )


async def missing_secrets(kube: Kube, agent: DurableAgent, namespace: str) -> list[str]:
    """One line per Secret (or key) the pods would need but that does not exist."""
    refs = []
    for where, model in agent.spec.model.choices():
        if model.api_key_secret_ref is not None:
            refs.append((f"{where}.apiKeySecretRef", model.api_key_secret_ref))
    if agent.spec.webhook is not None:
        refs.append(("spec.webhook.secretRef", agent.spec.webhook.secret_ref))
        if agent.spec.webhook.previous_secret_ref is not None:
            refs.append(("spec.webhook.previousSecretRef", agent.spec.webhook.previous_secret_ref))
    notify = agent.spec.approvals.notify
    if notify is not None and notify.url_secret_ref is not None:
        refs.append(("spec.approvals.notify.urlSecretRef", notify.url_secret_ref))
    if notify is not None and notify.slack_signing_secret_ref is not None:
        refs.append(
            ("spec.approvals.notify.slackSigningSecretRef", notify.slack_signing_secret_ref)
        )
    refs.extend((field, ref) for field, ref, _ in agent.spec.mcp_secrets())
    problems = []
    for field, ref in refs:
        secret = await kube.get("v1", "Secret", namespace, ref.name)
        if secret is None:
            problems.append(
                f"Secret {namespace}/{ref.name} named by {field} does not exist; create it with "
                f"`kubectl -n {namespace} create secret generic {ref.name} "
                f"--from-literal={ref.key}=...`"
            )
        elif ref.key not in {**secret.get("data", {}), **secret.get("stringData", {})}:
            problems.append(f"Secret {namespace}/{ref.name} has no key {ref.key!r} ({field}.key)")
    return problems


def url_of(settings: OperatorSettings, service: dict[str, Any], agent: str, digest: str) -> str:
    ports = service.get("spec", {}).get("ports", [])
    node_port = ports[0].get("nodePort", "") if ports else ""
    return settings.worker_url(
        service=service["metadata"]["name"],
        namespace=service["metadata"]["namespace"],
        agent=agent,
        hash=digest,
        port=WORKER_PORT,
        node_port=node_port,
    )


async def apply_version(
    kube: Kube, settings: OperatorSettings, body: kopf.Body, agent: DurableAgent
) -> tuple[str, str]:
    """Apply the current version's objects and the agent's sidecar; (hash, worker URL)."""
    namespace = str(body["metadata"]["namespace"])
    objects = render.version_objects(agent, namespace, settings)
    sidecar = render.sidecar_objects(agent, namespace, settings)
    kept = await _replicas_scaled_elsewhere(kube, namespace, objects.name)
    if kept is not None:
        objects.deployment["spec"]["replicas"] = kept
    manifests = [*sidecar.manifests, *objects.manifests]
    egress = await egress_policy(kube, settings, agent, namespace)
    if egress is not None:  # before the pods it confines start
        manifests.insert(0, egress)
    kopf.adopt(manifests, owner=body)
    applied = [await kube.apply(manifest) for manifest in manifests]
    service = applied[manifests.index(objects.service)]
    return objects.hash, url_of(settings, service, agent.metadata.name, objects.hash)


async def _replicas_scaled_elsewhere(kube: Kube, namespace: str, name: str) -> int | None:
    """The replicas of the version's Deployment when another field manager owns them, not
    `worker.replicas`: the scaler (`scaling`: at zero, autoscaled), an HPA or KEDA (through
    the scale subresource), `kubectl scale`. The apply keeps them: leaving the field out would
    let the API server default it to 1 where this operator owned it alone."""
    found = await kube.get("apps/v1", "Deployment", namespace, name)
    if found is None:
        return None
    for entry in found["metadata"].get("managedFields") or []:
        owned = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if entry.get("manager") != FIELD_MANAGER and "f:replicas" in owned:
            return int(found["spec"].get("replicas", 1))
    return None


async def egress_policy(
    kube: Kube, settings: OperatorSettings, agent: DurableAgent, namespace: str
) -> Manifest | None:
    """The agent's egress policy, with a rule per in-cluster MCP server it names (and its
    in-cluster trace collector)."""
    collector = render.otlp_endpoint(agent, settings)
    mcp_servers = await mcp_egress_rules(kube, agent, namespace, [collector] if collector else [])
    return render.egress_policy(agent.metadata.name, namespace, settings, mcp_servers)


async def refresh_egress(
    kube: Kube,
    settings: OperatorSettings,
    body: kopf.Body,
    agent: DurableAgent,
    applied: list[Manifest] | None,
) -> list[Manifest] | None:
    """Apply the egress policy again if its rules changed since `applied` (an MCP server's
    Service appeared, went or changed); the rules it has now."""
    namespace = str(body["metadata"]["namespace"])
    policy = await egress_policy(kube, settings, agent, namespace)
    if policy is None:
        return None
    rules: list[Manifest] = policy["spec"]["egress"]
    if rules != applied:
        kopf.adopt(policy, owner=body)
        await kube.apply(policy)
    return rules


async def _service_url(
    kube: Kube, settings: OperatorSettings, namespace: str, name: str, agent: str, digest: str
) -> str | None:
    """Where Restate reaches Service `name` (reads it when the template needs a node port)."""
    if "{node_port}" not in settings.worker_url_template:
        service = {"metadata": {"name": name, "namespace": namespace}, "spec": {}}
        return url_of(settings, service, agent, digest)
    found = await kube.get("v1", "Service", namespace, name)
    return None if found is None else url_of(settings, found, agent, digest)


async def version_url(
    kube: Kube, settings: OperatorSettings, namespace: str, agent: str, digest: str
) -> str | None:
    """The URL of an existing version."""
    name = version_name(agent, digest)
    return await _service_url(kube, settings, namespace, name, agent, digest)


async def sidecar_url(
    kube: Kube, settings: OperatorSettings, namespace: str, agent: str
) -> str | None:
    """Where Restate reaches the sidecar's index (`{hash}` is `sidecar` in the URL template)."""
    name = sidecar_name(agent)
    return await _service_url(kube, settings, namespace, name, agent, SIDECAR_VERSION)


ANSWER_TIMEOUT = aiohttp.ClientTimeout(total=1.0)


async def answers(url: str) -> bool:
    """Whether the version's worker answers at `url` (the Restate SDK's /health): its pod can be
    Ready a moment before the Service routes to it (kube-proxy programs Services about once a
    second), and a registration sent in that moment fails."""
    try:
        async with (
            aiohttp.ClientSession(trust_env=False, timeout=ANSWER_TIMEOUT) as session,
            session.get(url.rstrip("/") + "/health") as response,
        ):
            return response.status == 200
    except (aiohttp.ClientError, OSError, TimeoutError):
        return False


async def delete_version(kube: Kube, namespace: str, agent: str, digest: str) -> None:
    name = version_name(agent, digest)
    for api_version, kind in KINDS:
        await kube.delete(api_version, kind, namespace, name)


async def delete_sidecar(kube: Kube, namespace: str, agent: str) -> None:
    for api_version, kind in KINDS:
        await kube.delete(api_version, kind, namespace, sidecar_name(agent))


async def versions_on_cluster(kube: Kube, namespace: str, agent: str) -> set[str]:
    """Hashes of every version with any object left (a crash can leave a partial set)."""
    found: set[str] = set()
    for api_version, kind in KINDS:
        for item in await kube.list(api_version, kind, namespace, {AGENT_LABEL: agent}):
            digest = item["metadata"].get("labels", {}).get(VERSION_LABEL)
            if digest:
                found.add(digest)
    return found
