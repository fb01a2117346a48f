"""The Kubernetes objects of an agent, as plain manifests for server-side apply: those of one
version, and the agent's sidecar, which every version shares.

A version is identified by a hash of the agent spec (without `drain`, `scaling`, `sidecar` and
`worker.replicas`, which change how versions are run, not what runs) and of the pod template.
Same input, same hash, same names: a rollback to an earlier spec maps onto the earlier
version's objects.

The sidecar is a Deployment of its own, so that webhooks, metrics and the index of parked calls
answer whichever versions have pods (a version at zero replicas has none). Its pods run the
sidecar (FastAPI: webhooks, approvals, the event stream, metrics) and the index container (what
the runs of every version share: the agent's `<agent>-parked`, `<agent>-live`, `<agent>-inbox`
and `<agent>-budget` objects, a Restate deployment of their own); its
ConfigMap holds the same spec document, and a hash of both in the pod template rolls the pods
when either changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tether.programs.restate_identity import IDENTITY_KEYS_ENV
from tether.secret_env import PREVIOUS_SECRET_ENV, SLACK_SIGNING_SECRET_ENV
from tether.spec import API_VERSION, KIND, DurableAgent, DurableAgentSpec
from tether.spec.stopping import GRACEFUL_TIMEOUT_ENV, pod_grace_seconds, stop_grace_seconds

from .names import (
    COMPONENT_LABEL,
    CONFIG_HASH_ANNOTATION,
    METRICS_DIR,
    SIDECAR_PORT,
    SPEC_DIR,
    SPEC_FILE,
    VERSION_LABEL,
    WORKER_METRICS_PORT,
    WORKER_PORT,
    WORKSPACE_DIR,
    agent_labels,
    content_hash,
    selector,
    sidecar_name,
    version_labels,
    version_name,
)
from .settings import OperatorSettings

Manifest = dict[str, Any]
RUN_AS = 65532


@dataclass(frozen=True)
class PodObjects:
    """Everything one version, or the agent's sidecar, consists of, plus its hash."""

    hash: str
    config_map: Manifest
    deployment: Manifest
    service: Manifest
    disruption_budget: Manifest

    @property
    def name(self) -> str:
        return str(self.deployment["metadata"]["name"])

    @property
    def manifests(self) -> list[Manifest]:
        """In the order they are applied: the pods' ConfigMap and Service before the pods."""
        return [self.config_map, self.service, self.disruption_budget, self.deployment]


def spec_document(agent: DurableAgent, namespace: str) -> str:
    """`agent.yaml` for the worker: the manifest with the normalised spec (no secrets in it).
    Without its schedules, which the operator keeps on Restate and no pod reads: a schedule's
    change rolls out no version."""
    spec = agent.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    spec.pop("schedules", None)
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": agent.metadata.name, "namespace": namespace},
        "spec": spec,
    }
    return yaml.safe_dump(document, sort_keys=False)


def api_key_envs(spec: DurableAgentSpec) -> list[Manifest]:
    """The models' API keys from their Secrets, one variable each (the spec's model first)."""
    env: dict[str, Manifest] = {}
    for _, model in spec.model.choices():
        ref = model.api_key_secret_ref
        if ref is not None:
            variable = model.key_variable or model.api_key_env or "TETHER_MODEL_API_KEY"
            env.setdefault(variable, _secret_env(variable, ref.name, ref.key))
    return list(env.values())


def _secret_env(name: str, secret: str, key: str) -> Manifest:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def sidecar_url(settings: OperatorSettings, agent: str, namespace: str) -> str:
    return settings.webhook_url(
        service=sidecar_name(agent),
        namespace=namespace,
        agent=agent,
        hash="",
        port=SIDECAR_PORT,
        node_port="",
    )


def _shared_env(agent: DurableAgent, namespace: str, settings: OperatorSettings) -> list[Manifest]:
    env: list[Manifest] = [
        {"name": "TETHER_AGENT", "value": agent.metadata.name},
        {"name": "TETHER_SPEC", "value": f"{SPEC_DIR}/{SPEC_FILE}"},
        {
            "name": "TETHER_WEBHOOK_BASE_URL",
            "value": sidecar_url(settings, agent.metadata.name, namespace),
        },
        {"name": "PROMETHEUS_MULTIPROC_DIR", "value": METRICS_DIR},
        {"name": "HOME", "value": "/tmp"},
    ]
    webhook = agent.spec.webhook
    if webhook is not None:
        env.append(
            _secret_env("TETHER_WEBHOOK_SECRET", webhook.secret_ref.name, webhook.secret_ref.key)
        )
        previous = webhook.previous_secret_ref
        if previous is not None:
            env.append(_secret_env(PREVIOUS_SECRET_ENV, previous.name, previous.key))
    return env


def _container_security() -> Manifest:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _mounts(*extra: Manifest) -> list[Manifest]:
    return [
        {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
        {"name": "metrics", "mountPath": METRICS_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        *extra,
    ]


def otlp_endpoint(agent: DurableAgent, settings: OperatorSettings) -> str | None:
    """Where the agent's traces go: `spec.observability.otlpEndpoint`, else the operator's."""
    observability = agent.spec.observability
    return (observability.otlp_endpoint if observability else None) or settings.otlp_endpoint


def _overridable_env(agent: DurableAgent, settings: OperatorSettings) -> list[Manifest]:
    """The worker's variables that `spec.worker.env` wins over: OpenTelemetry's, when it has a
    collector (OTEL_TRACES_EXPORTER=none turns the traces off), and its graceful timeout."""
    wanted: dict[str, str] = {}
    endpoint = otlp_endpoint(agent, settings)
    if endpoint is not None:
        wanted["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
        wanted["OTEL_SERVICE_NAME"] = agent.metadata.name
    wanted[GRACEFUL_TIMEOUT_ENV] = f"{stop_grace_seconds(agent.spec):g}"
    own = {e.name for e in agent.spec.worker.env}
    return [{"name": k, "value": v} for k, v in wanted.items() if k not in own]


def _worker_container(
    agent: DurableAgent, namespace: str, settings: OperatorSettings, image: str
) -> Manifest:
    spec = agent.spec
    env = _shared_env(agent, namespace, settings)
    env.append({"name": "TETHER_WORKSPACE", "value": WORKSPACE_DIR})
    env.append({"name": "RESTATE_INGRESS_URL", "value": settings.restate_ingress_url})
    if settings.restate_identity_keys:  # only Restate may invoke the worker
        keys = ",".join(settings.restate_identity_keys)
        env.append({"name": IDENTITY_KEYS_ENV, "value": keys})
    env.extend(api_key_envs(spec))
    notify = spec.approvals.notify
    if notify is not None and notify.url_secret_ref is not None:
        # The URL can be a credential (a Slack webhook's path is its token): from its Secret,
        # like the API key, never through the ConfigMap (which holds only the reference).
        secret = notify.url_secret_ref
        env.append(_secret_env(notify.url_variable, secret.name, secret.key))
    for _, secret, variable in spec.mcp_secrets():  # credentials of MCP servers
        env.append(_secret_env(variable, secret.name, secret.key))
    env.extend(_overridable_env(agent, settings))
    env.extend({"name": e.name, "value": e.value} for e in spec.worker.env)
    resources: Manifest = {}
    if spec.worker.resources.requests:
        resources["requests"] = dict(spec.worker.resources.requests)
    if spec.worker.resources.limits:
        resources["limits"] = dict(spec.worker.resources.limits)
    return {
        "name": "worker",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["tether", "worker", "--spec", f"{SPEC_DIR}/{SPEC_FILE}", "--serve", "agent"],
        "args": ["--port", str(WORKER_PORT), "--metrics-port", str(WORKER_METRICS_PORT)],
        "ports": [
            {"name": "restate", "containerPort": WORKER_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": WORKER_METRICS_PORT, "protocol": "TCP"},
        ],
        "env": env,
        "resources": resources,
        **_probes(WORKER_LISTENS, WORKER_SERVES),
        "securityContext": _container_security(),
        "volumeMounts": _mounts({"name": "workspace", "mountPath": WORKSPACE_DIR}),
    }


def _probes(check: Manifest, serving: Manifest | None = None) -> Manifest:
    """Probes that find a started process within a second: the kubelet probes readiness at
    once when the startup probe passes, where a readiness probe alone that first met a process
    not yet listening waited a whole period (a replaced worker stood still up to 12 s). The
    first probe waits a second: no process listens sooner, and each miss is a Warning event.
    `serving`, when given, is what startup and readiness ask instead of `check` (liveness):
    the hypercorn master listens before its child has imported the app, and a pod Ready then
    takes Restate's retries into a backlog that waits out the import."""
    ready = serving or check
    return {
        "startupProbe": {
            **ready,
            "initialDelaySeconds": 1,
            "periodSeconds": 1,
            "failureThreshold": 120,
        },
        "readinessProbe": {**ready, "periodSeconds": 10, "timeoutSeconds": 5},
        "livenessProbe": {**check, "periodSeconds": 10, "failureThreshold": 6},
    }


WORKER_LISTENS = {"tcpSocket": {"port": "restate"}}
WORKER_SERVES = {"httpGet": {"path": "/health", "port": "restate"}}
"""The worker's app answers (the Restate SDK's `/health`, which needs no signature)."""


def _sidecar_container(
    agent: DurableAgent, namespace: str, settings: OperatorSettings, image: str
) -> Manifest:
    env = _shared_env(agent, namespace, settings)
    env.append({"name": "RESTATE_INGRESS_URL", "value": settings.restate_ingress_url})
    notify = agent.spec.approvals.notify
    if notify is not None and notify.slack_signing_secret_ref is not None:
        # Only the sidecar verifies Slack's clicks: the worker never gets the signing secret.
        secret = notify.slack_signing_secret_ref
        env.append(_secret_env(SLACK_SIGNING_SECRET_ENV, secret.name, secret.key))

    # /healthz, not /readyz (which asks Restate): a pod's readiness also gates its index's
    # endpoint, and a Restate restart must not take every agent's index out of service.
    check = {"httpGet": {"path": "/healthz", "port": "http"}}
    command = ["tether", "sidecar"]
    return _small_container("sidecar", image, settings, command, ("http", SIDECAR_PORT), env, check)


def _small_container(
    name: str,
    image: str,
    settings: OperatorSettings,
    command: list[str],
    port: tuple[str, int],
    env: list[Manifest],
    check: Manifest,
    serving: Manifest | None = None,
) -> Manifest:
    """A container of the sidecar's pods: one port, small requests, no workspace."""
    port_name, number = port
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        "args": ["--port", str(number)],
        "ports": [{"name": port_name, "containerPort": number, "protocol": "TCP"}],
        "env": env,
        "resources": {
            "requests": {"cpu": "10m", "memory": "64Mi"},
            "limits": {"memory": "256Mi"},
        },
        **_probes(check, serving),
        "securityContext": _container_security(),
        "volumeMounts": _mounts(),
    }


def _index_container(
    agent: DurableAgent, namespace: str, settings: OperatorSettings, image: str
) -> Manifest:
    """What the runs of every version share (the index of parked calls, the live events, the
    inboxes, the budget ledgers), served to Restate: it holds the webhook secret (to check proofs
    and signatures), no model key and no tool."""
    env = _shared_env(agent, namespace, settings)
    if settings.restate_identity_keys:  # only Restate may invoke it
        env.append({"name": IDENTITY_KEYS_ENV, "value": ",".join(settings.restate_identity_keys)})
    command = ["tether", "worker", "--spec", f"{SPEC_DIR}/{SPEC_FILE}", "--serve", "index"]
    port = ("restate", WORKER_PORT)
    return _small_container(
        "index", image, settings, command, port, env, WORKER_LISTENS, WORKER_SERVES
    )


def _pod_security() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _spread(labels: dict[str, str]) -> list[Manifest]:
    """Replicas go to different nodes where there are several, never left unscheduled where
    there is one."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": labels},
        }
    ]


def _tmp() -> Manifest:
    return {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}


def pod_template(
    agent: DurableAgent, namespace: str, settings: OperatorSettings, version_hash: str
) -> Manifest:
    name = agent.metadata.name
    image = agent.spec.worker.image or settings.worker_image
    return {
        "metadata": {"labels": {**version_labels(name, version_hash), COMPONENT_LABEL: "worker"}},
        "spec": {
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": pod_grace_seconds(agent.spec),
            "securityContext": _pod_security(),
            "topologySpreadConstraints": _spread(selector(name, version_hash)),
            "containers": [_worker_container(agent, namespace, settings, image)],
            "volumes": [
                {"name": "spec", "configMap": {"name": version_name(name, version_hash)}},
                {"name": "metrics", "emptyDir": {}},
                _workspace(agent),
                _tmp(),
            ],
        },
    }


def _workspace(agent: DurableAgent) -> Manifest:
    claim = agent.spec.worker.workspace_claim
    if claim is None:
        return {"name": "workspace", "emptyDir": {}}
    return {"name": "workspace", "persistentVolumeClaim": {"claimName": claim}}


def _hash_input(agent: DurableAgent) -> Manifest:
    spec = agent.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    spec.pop("drain", None)
    spec.pop("scaling", None)
    spec.pop("sidecar", None)
    spec.pop("schedules", None)  # kept on Restate by the operator (`schedules`)
    spec.get("worker", {}).pop("replicas", None)
    return spec


def version_hash(agent: DurableAgent, namespace: str, settings: OperatorSettings) -> str:
    """The version of this spec: the agent spec and the pod template it renders to."""
    template = pod_template(agent, namespace, settings, version_hash="")
    return content_hash(_hash_input(agent), template)


def _metadata(
    name: str, namespace: str, labels: dict[str, str], settings: OperatorSettings
) -> Manifest:
    return {"name": name, "namespace": namespace, "labels": {**settings.labels, **labels}}


def version_objects(agent: DurableAgent, namespace: str, settings: OperatorSettings) -> PodObjects:
    """ConfigMap, Deployment, worker Service and PodDisruptionBudget of the agent's current
    version."""
    name = agent.metadata.name
    digest = version_hash(agent, namespace, settings)
    object_name = version_name(name, digest)
    labels = {**version_labels(name, digest), COMPONENT_LABEL: "worker"}
    config_map: Manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(object_name, namespace, labels, settings),
        "data": {SPEC_FILE: spec_document(agent, namespace)},
    }
    deployment: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(object_name, namespace, labels, settings),
        "spec": {
            "replicas": agent.spec.worker.replicas,
            "revisionHistoryLimit": 1,
            "selector": {"matchLabels": selector(name, digest)},
            "strategy": {"type": "RollingUpdate"},
            "template": pod_template(agent, namespace, settings, digest),
        },
    }
    service: Manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(object_name, namespace, labels, settings),
        "spec": {
            "type": settings.worker_service_type,
            "selector": selector(name, digest),
            # Restate is this Service's only client, and it retries a connection that is refused.
            # A new pod is routed to as soon as it has an address, not after its probes and the
            # next kube-proxy sync: a run whose only worker died waits for the replacement's
            # process to listen, and no longer.
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": "restate",
                    "port": WORKER_PORT,
                    "targetPort": "restate",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                }
            ],
        },
    }
    # A node drain evicts one worker of a version at a time: with 2+ replicas a run's next step
    # always has a pod, with one the drain is never blocked.
    disruption_budget: Manifest = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(object_name, namespace, labels, settings),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(name, digest)}},
    }
    return PodObjects(digest, config_map, deployment, service, disruption_budget)


def sidecar_selector(agent: str) -> dict[str, str]:
    return {**selector(agent), COMPONENT_LABEL: "sidecar"}


def sidecar_objects(agent: DurableAgent, namespace: str, settings: OperatorSettings) -> PodObjects:
    """The agent's sidecar (see the module's docstring)."""
    name = agent.metadata.name
    object_name = sidecar_name(name)
    labels = {**agent_labels(name), COMPONENT_LABEL: "sidecar"}
    image = agent.spec.worker.image or settings.worker_image
    document = spec_document(agent, namespace)
    pod_spec: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 30,
        "securityContext": _pod_security(),
        "topologySpreadConstraints": _spread(sidecar_selector(name)),
        "containers": [
            _sidecar_container(agent, namespace, settings, image),
            _index_container(agent, namespace, settings, image),
        ],
        "volumes": [
            {"name": "spec", "configMap": {"name": object_name}},
            {"name": "metrics", "emptyDir": {}},
            _tmp(),
        ],
    }
    digest = content_hash(document, pod_spec)
    config_map: Manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(object_name, namespace, labels, settings),
        "data": {SPEC_FILE: document},
    }
    deployment: Manifest = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(object_name, namespace, labels, settings),
        "spec": {
            "replicas": agent.spec.sidecar.replicas,
            "revisionHistoryLimit": 1,
            "selector": {"matchLabels": sidecar_selector(name)},
            "strategy": {"type": "RollingUpdate"},
            "template": {
                # A changed spec (the ConfigMap) rolls the pods too.
                "metadata": {"labels": labels, "annotations": {CONFIG_HASH_ANNOTATION: digest}},
                "spec": pod_spec,
            },
        },
    }
    service: Manifest = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(object_name, namespace, labels, settings),
        "spec": {
            # Restate reaches the index as it reaches the versions (a NodePort when it runs
            # outside the cluster); the Restate port comes first, the one a node port URL uses.
            "type": settings.worker_service_type,
            "selector": sidecar_selector(name),
            "ports": [
                {
                    "name": "restate",
                    "port": WORKER_PORT,
                    "targetPort": "restate",
                    "protocol": "TCP",
                    "appProtocol": "kubernetes.io/h2c",
                },
                {"name": "http", "port": SIDECAR_PORT, "targetPort": "http", "protocol": "TCP"},
            ],
        },
    }
    disruption_budget: Manifest = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(object_name, namespace, labels, settings),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": sidecar_selector(name)}},
    }
    return PodObjects(digest, config_map, deployment, service, disruption_budget)


DNS_RULE: Manifest = {
    "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
    # A policy sees the port the DNS pod listens on: 53, or the port kubeadm's CoreDNS names
    # `dns`/`dns-tcp` wherever it listens (on an unprivileged port, say).
    "ports": [
        {"protocol": "UDP", "port": 53},
        {"protocol": "TCP", "port": 53},
        {"protocol": "UDP", "port": "dns"},
        {"protocol": "TCP", "port": "dns-tcp"},
    ],
}


def egress_policy(
    agent: str, namespace: str, settings: OperatorSettings, extra: Sequence[Manifest] = ()
) -> Manifest | None:
    """What the agent's pods may connect to: the cluster's DNS, the operator's rules (by
    default Restate's ingress and the internet outside private ranges) and `extra` (the agent's
    in-cluster MCP servers, `mcp_egress`). Its tools run in these pods, so this is what a tool
    can reach; nothing else in the cluster (other pods, the API server, cloud metadata). None
    when the operator renders no egress policy."""
    if settings.agent_egress is None:
        return None
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(f"{agent}-egress", namespace, agent_labels(agent), settings),
        "spec": {
            "podSelector": {"matchLabels": selector(agent)},
            "policyTypes": ["Egress"],
            "egress": [DNS_RULE, *settings.agent_egress, *extra],
        },
    }


def version_of(labels: dict[str, str]) -> str | None:
    return labels.get(VERSION_LABEL)
