"""Applying a DurableAgent: the objects of its version, registration with the real Restate, runs
through the ingress, status and events, and idempotent server-side apply."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from tests.operator.op_harness import EGRESS_RULES, Cluster, OperatorFactory, Restate, wait_for
from tether.spec import parse_agent

AGENT = "triage"


def manifest(name: str = AGENT, system: str = "You triage.", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "provider": "anthropic",
                "name": "claude-sonnet-4-5",
                "apiKeySecretRef": {"name": "llm", "key": "api-key"},
            },
            "system": system,
            "tools": [{"name": "ask", "builtin": "ask_human"}],
            "webhook": {"secretRef": {"name": "hooks", "key": "secret"}},
            "worker": {"resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "512Mi"}}},
            "drain": {"delay": "0s", "timeout": "10m"},
            **spec,
        },
    }


def with_secrets(cluster: Cluster) -> Cluster:
    cluster.secret("llm", {"api-key": "sk-test-not-real"})
    cluster.secret("hooks", {"secret": "hmac-key"})
    return cluster


def registered(cluster: Cluster, name: str = AGENT) -> dict[str, Any]:
    condition = cluster.condition(name, "Registered")
    return condition if condition.get("status") == "True" else {}


def env_of(container: Any) -> dict[str, Any]:
    return {e.name: e for e in container.env}


def test_an_agent_gets_its_objects_registers_and_serves_runs(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    run_operator()
    cluster.apply_agent(manifest())
    wait_for(lambda: registered(cluster), timeout=60, what="Registered=True")

    status = cluster.status(AGENT)
    [version] = status["versions"]
    digest, name = version["hash"], f"{AGENT}-{version['hash']}"
    assert version["state"] == "Active" and version["restateDeploymentId"].startswith("dp_")
    assert status["phase"] == "Ready" and status["readyVersions"] == "1/1"
    assert status["activeVersion"] == digest
    assert status["endpoint"] == f"{restate.server.ingress_url}/{AGENT}/{{session}}/run"
    assert status["webhookUrl"] == f"http://{AGENT}-sidecar.{cluster.namespace}.svc:8000"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True",
        "Registered": "True",
        "Progressing": "False",
        "Draining": "False",
    }

    # The ConfigMap carries the normalised spec, which the worker loads as it is; no secrets.
    config_map = cluster.core.read_namespaced_config_map(name, cluster.namespace)
    assert config_map.data is not None
    document = yaml.safe_load(config_map.data["agent.yaml"])
    assert parse_agent(document).spec.system == "You triage."
    assert "sk-test" not in config_map.data["agent.yaml"]
    assert "hmac-key" not in config_map.data["agent.yaml"]

    # What the agent's pods (and so its tools) may connect to: DNS and the operator's rules.
    policies = client.NetworkingV1Api(cluster.api)
    egress = policies.read_namespaced_network_policy(f"{AGENT}-egress", cluster.namespace)
    assert egress.metadata is not None and egress.spec is not None
    assert egress.spec.pod_selector.match_labels == {"tether.dev/agent": AGENT}
    assert egress.spec.policy_types == ["Egress"] and egress.spec.ingress is None
    dns, *rules = cluster.api.sanitize_for_serialization(egress.spec)["egress"]
    assert {p["port"] for p in dns["ports"]} == {53, "dns", "dns-tcp"} and rules == EGRESS_RULES
    [owner] = egress.metadata.owner_references or []
    assert (owner.kind, owner.name) == ("DurableAgent", AGENT)

    deployment = cluster.apps.read_namespaced_deployment(name, cluster.namespace)
    assert deployment.metadata is not None and deployment.spec is not None
    [owner] = deployment.metadata.owner_references or []
    assert (owner.kind, owner.name, owner.controller) == ("DurableAgent", AGENT, True)
    pod = deployment.spec.template.spec
    assert pod is not None and pod.security_context is not None
    assert pod.security_context.run_as_non_root is True
    assert pod.security_context.seccomp_profile is not None
    assert pod.security_context.seccomp_profile.type == "RuntimeDefault"
    assert pod.automount_service_account_token is False
    [worker] = pod.containers
    spec_file = ["--spec", "/etc/tether/agent.yaml"]
    assert worker.command == ["tether", "worker", *spec_file, "--serve", "agent"]
    assert worker.args == ["--port", "9080", "--metrics-port", "9090"]
    assert {p.name: p.container_port for p in worker.ports or []} == {
        "restate": 9080,
        "metrics": 9090,
    }
    # The agent's sidecar: its own Deployment, up whichever versions have pods.
    sidecar_name = f"{AGENT}-sidecar"
    sidecar_deployment = cluster.apps.read_namespaced_deployment(sidecar_name, cluster.namespace)
    assert sidecar_deployment.metadata is not None and sidecar_deployment.spec is not None
    [owner] = sidecar_deployment.metadata.owner_references or []
    assert (owner.kind, owner.name, owner.controller) == ("DurableAgent", AGENT, True)
    assert sidecar_deployment.spec.replicas == 1
    sidecar_pod = sidecar_deployment.spec.template.spec
    assert sidecar_pod is not None and sidecar_pod.automount_service_account_token is False
    assert sidecar_pod.security_context == pod.security_context
    sidecar, index = sidecar_pod.containers
    assert sidecar.command == ["tether", "sidecar"] and sidecar.args == ["--port", "8000"]
    assert index.command == ["tether", "worker", *spec_file, "--serve", "index"]
    assert index.args == ["--port", "9080"]
    for container in (worker, sidecar, index):
        security = container.security_context
        assert security is not None and security.capabilities is not None
        assert security.read_only_root_filesystem is True
        assert security.allow_privilege_escalation is False
        assert security.capabilities.drop == ["ALL"]
        assert security.run_as_non_root is True
        env = env_of(container)
        webhook = env["TETHER_WEBHOOK_SECRET"].value_from.secret_key_ref
        assert (webhook.name, webhook.key) == ("hooks", "secret")
        assert env["TETHER_SPEC"].value == "/etc/tether/agent.yaml"
        assert env["PROMETHEUS_MULTIPROC_DIR"].value == "/var/run/tether/metrics"
        assert env["TETHER_WEBHOOK_BASE_URL"].value == status["webhookUrl"]
        assert env["TETHER_AGENT"].value == AGENT
        mounts = {m.mount_path for m in container.volume_mounts or []}
        assert {"/etc/tether", "/var/run/tether/metrics", "/tmp"} <= mounts
    for container in (worker, sidecar):
        assert env_of(container)["RESTATE_INGRESS_URL"].value == restate.server.ingress_url
    key = env_of(worker)["ANTHROPIC_API_KEY"].value_from.secret_key_ref
    assert (key.name, key.key) == ("llm", "api-key")
    # The model key stays in the worker; the sidecar's pods run no tool.
    assert "ANTHROPIC_API_KEY" not in env_of(sidecar) | env_of(index)
    # The pods reach Restate through the ingress only: the admin API reads and kills every
    # agent's runs.
    assert not {"RESTATE_ADMIN_URL"} & (env_of(sidecar).keys() | env_of(worker).keys())
    assert "/workspace" in {m.mount_path for m in worker.volume_mounts or []}
    assert "/workspace" not in {m.mount_path for m in sidecar.volume_mounts or []}
    # Ready once the app answers, not once the hypercorn master listens (before its child has
    # imported the app); alive while it listens.
    for hypercorn in (worker, index):
        ready = hypercorn.readiness_probe
        assert ready is not None and ready.http_get is not None
        assert (ready.http_get.path, ready.http_get.port) == ("/health", "restate")
        assert hypercorn.startup_probe is not None and hypercorn.startup_probe.period_seconds == 1
        assert hypercorn.startup_probe.http_get is not None
        alive = hypercorn.liveness_probe
        assert alive is not None and alive.tcp_socket is not None
    assert sidecar.startup_probe is not None and sidecar.startup_probe.period_seconds == 1
    # Readiness never asks Restate: a Restate restart must not pull the index's endpoint.
    assert sidecar.readiness_probe is not None and sidecar.readiness_probe.http_get is not None
    assert sidecar.readiness_probe.http_get.path == "/healthz"
    assert sidecar.liveness_probe is not None and sidecar.liveness_probe.http_get is not None
    assert sidecar.liveness_probe.http_get.path == "/healthz"
    assert worker.resources is not None
    assert worker.resources.requests == {"cpu": "100m"}
    assert worker.resources.limits == {"memory": "512Mi"}
    volumes = {v.name: v for v in pod.volumes or []}
    assert volumes["spec"].config_map is not None and volumes["spec"].config_map.name == name
    assert volumes["metrics"].empty_dir is not None and volumes["workspace"].empty_dir is not None
    sidecar_volumes = {v.name: v for v in sidecar_pod.volumes or []}
    assert sidecar_volumes["spec"].config_map is not None
    assert sidecar_volumes["spec"].config_map.name == sidecar_name
    sidecar_config = cluster.core.read_namespaced_config_map(sidecar_name, cluster.namespace)
    assert sidecar_config.data == config_map.data  # the same spec document

    service = cluster.core.read_namespaced_service(name, cluster.namespace)
    assert service.spec is not None and service.spec.ports is not None
    assert [(p.port, p.app_protocol) for p in service.spec.ports] == [(9080, "kubernetes.io/h2c")]
    assert service.spec.selector == {"tether.dev/agent": AGENT, "tether.dev/version": digest}
    assert service.spec.publish_not_ready_addresses  # Restate retries; it need not wait probes
    sidecars = cluster.core.read_namespaced_service(sidecar_name, cluster.namespace)
    assert sidecars.spec is not None and sidecars.spec.ports is not None
    assert sidecars.spec.selector == {
        "tether.dev/agent": AGENT,
        "app.kubernetes.io/component": "sidecar",
    }
    assert [(p.name, p.port) for p in sidecars.spec.ports] == [("restate", 9080), ("http", 8000)]

    # Restate knows the sidecar's index, registered before the version, tagged with the agent.
    [sidecar_id] = restate.deployments_of(cluster.namespace, AGENT, sidecar=True)
    assert status["sidecar"]["restateDeploymentId"] == sidecar_id
    assert restate.deployments()[sidecar_id]["metadata"] == {
        "tether.dev/agent": f"{cluster.namespace}/{AGENT}",
        "tether.dev/role": "sidecar",
    }
    served = {s["name"] for s in restate.deployments()[sidecar_id]["services"]}
    assert served == {f"{AGENT}-parked", f"{AGENT}-live"}

    # Restate knows the version under the id in the status, tagged with the agent.
    deployment_id = version["restateDeploymentId"]
    found = restate.deployments()[deployment_id]
    assert found["metadata"] == {
        "tether.dev/agent": f"{cluster.namespace}/{AGENT}",
        "tether.dev/version": digest,
    }
    # A run through the ingress reaches the worker of that version.
    assert restate.call(AGENT, "s1", "hello")["version"] == digest

    reasons = {e["reason"] for e in cluster.events(AGENT)}
    assert {"VersionDeployed", "Registered"} <= reasons


SLACK_TOKEN = "T0kenT0kenT0kenT0kenT0ken"
SLACK_URL = f"https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/{SLACK_TOKEN}"
NOTIFY = {"notify": {"urlSecretRef": {"name": "slack", "key": "url"}}}
"""Approval notifications to a Slack incoming webhook: its URL's path is its token."""


def test_the_notify_url_reaches_the_worker_from_its_secret_only(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, tmp_path: Path
) -> None:
    """`approvals.notify.urlSecretRef` is mapped into the worker's TETHER_NOTIFY_URL by a
    `secretKeyRef`; the ConfigMap holds the reference, and nothing the operator writes (objects,
    status, events, its log) holds the URL."""
    with_secrets(cluster)
    cluster.secret("slack", {"url": SLACK_URL})
    run_operator()
    cluster.apply_agent(manifest(approvals=NOTIFY))
    wait_for(lambda: registered(cluster), timeout=60, what="Registered=True")
    [version] = cluster.versions(AGENT)
    name = f"{AGENT}-{version['hash']}"

    config_map = cluster.core.read_namespaced_config_map(name, cluster.namespace)
    assert config_map.data is not None
    document = config_map.data["agent.yaml"]
    notify = parse_agent(yaml.safe_load(document)).spec.approvals.notify
    assert notify is not None and notify.url is None
    assert notify.url_secret_ref is not None
    assert (notify.url_secret_ref.name, notify.url_secret_ref.key) == ("slack", "url")
    assert SLACK_TOKEN not in document and "hooks.slack.com" not in document

    deployment = cluster.apps.read_namespaced_deployment(name, cluster.namespace)
    assert deployment.spec is not None and deployment.spec.template.spec is not None
    [worker] = deployment.spec.template.spec.containers
    variable = env_of(worker)["TETHER_NOTIFY_URL"]
    assert variable.value is None and variable.value_from is not None
    ref = variable.value_from.secret_key_ref
    assert (ref.name, ref.key) == ("slack", "url")
    sidecars = cluster.apps.read_namespaced_deployment(f"{AGENT}-sidecar", cluster.namespace)
    assert sidecars.spec is not None and sidecars.spec.template.spec is not None
    for container in sidecars.spec.template.spec.containers:  # they never send notifications
        assert "TETHER_NOTIFY_URL" not in env_of(container)

    written = json.dumps(
        [
            cluster.agent(AGENT),
            cluster.events(AGENT),
            cluster.api.sanitize_for_serialization(deployment),
            cluster.api.sanitize_for_serialization(config_map),
        ]
    )
    assert SLACK_TOKEN not in written and "hooks.slack.com" not in written
    assert SLACK_TOKEN not in (tmp_path / "operator.log").read_text(errors="replace")


def test_applying_again_changes_nothing(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    """Several supervision passes and a restarted operator (resume handler re-applying every
    child with server-side apply) leave every object at the same resourceVersion."""
    with_secrets(cluster)
    operator = run_operator()
    cluster.apply_agent(manifest())
    wait_for(lambda: registered(cluster), timeout=60, what="Registered=True")
    [version] = cluster.versions(AGENT)
    name = f"{AGENT}-{version['hash']}"

    def versions_of_children() -> dict[str, str | None]:
        ns = cluster.namespace
        objects = {
            "deployment": cluster.apps.read_namespaced_deployment(name, ns),
            "service": cluster.core.read_namespaced_service(name, ns),
            "configmap": cluster.core.read_namespaced_config_map(name, ns),
            "sidecar": cluster.core.read_namespaced_service(f"{AGENT}-sidecar", ns),
            "sidecar-deployment": cluster.apps.read_namespaced_deployment(f"{AGENT}-sidecar", ns),
            "sidecar-configmap": cluster.core.read_namespaced_config_map(f"{AGENT}-sidecar", ns),
        }
        return {k: o.metadata.resource_version for k, o in objects.items() if o.metadata}

    # kwok and the controller-manager settle the Deployment's status first.
    wait_for(
        lambda: cluster.status(AGENT).get("readyVersions") == "1/1", timeout=30, what="1/1 ready"
    )
    before = versions_of_children()
    managers = {
        m.manager
        for m in cluster.apps.read_namespaced_deployment(
            name, cluster.namespace
        ).metadata.managed_fields  # type: ignore[union-attr]
        or []
        if m.operation == "Apply"
    }
    assert managers == {"tether-operator"}

    operator.process.stop()
    run_operator()
    wait_for(
        lambda: any(e["reason"] == "Registered" for e in cluster.events(AGENT)),
        timeout=30,
        what="the events of the first run",
    )
    # The restarted operator adopts the same version and sidecar without registering anything.
    agent_deployments = restate.deployments_of(cluster.namespace, AGENT)
    assert agent_deployments == {version["restateDeploymentId"]}
    sidecar_id = cluster.status(AGENT)["sidecar"]["restateDeploymentId"]
    assert restate.deployments_of(cluster.namespace, AGENT, sidecar=True) == {sidecar_id}
    resumed = cluster.agent(AGENT)
    assert resumed is not None
    wait_for(
        lambda: (
            "tether.dev/last-handled-configuration"
            in ((cluster.agent(AGENT) or {}).get("metadata", {}).get("annotations") or {})
        ),
        timeout=30,
        what="kopf's diff base annotation",
    )
    assert versions_of_children() == before
    assert cluster.versions(AGENT)[0]["restateDeploymentId"] == version["restateDeploymentId"]


def test_a_deleted_deployment_is_applied_again(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    run_operator()
    cluster.apply_agent(manifest())
    wait_for(lambda: registered(cluster), timeout=60, what="Registered=True")
    [version] = cluster.versions(AGENT)
    name = f"{AGENT}-{version['hash']}"
    cluster.apps.delete_namespaced_deployment(name, cluster.namespace)

    def back() -> bool:
        found = cluster.child_names(AGENT)["deployments"]
        return name in found and cluster.status(AGENT).get("readyVersions") == "1/1"

    wait_for(back, timeout=30, what="the Deployment re-applied and available")
    assert any(e["reason"] == "Repaired" for e in cluster.events(AGENT))
    # Same version, same Restate deployment: nothing was registered again.
    assert cluster.versions(AGENT)[0]["restateDeploymentId"] == version["restateDeploymentId"]

    # The sidecar's too, without registering it again.
    sidecar_id = cluster.status(AGENT)["sidecar"]["restateDeploymentId"]
    cluster.apps.delete_namespaced_deployment(f"{AGENT}-sidecar", cluster.namespace)
    wait_for(
        lambda: f"{AGENT}-sidecar" in cluster.child_names(AGENT, sidecar=True)["deployments"],
        timeout=30,
        what="the sidecar's Deployment re-applied",
    )
    wait_for(  # kopf posts events in the background
        lambda: (
            "the sidecar's objects were missing"
            in [e["message"] for e in cluster.events(AGENT) if e["reason"] == "Repaired"]
        ),
        timeout=10,
        what="a Repaired event for the sidecar",
    )
    assert cluster.status(AGENT)["sidecar"]["restateDeploymentId"] == sidecar_id
