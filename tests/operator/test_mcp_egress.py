"""The egress policy of an agent opens the way to its in-cluster MCP servers, and no further."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from tests.operator.op_harness import EGRESS_RULES, Cluster, OperatorFactory, Restate, wait_for
from tests.operator.test_children import manifest, with_secrets
from tether_operator.mcp_egress import rule_for, service_of


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://github-mcp:8080/mcp", ("agents", "github-mcp", 8080)),
        ("http://github-mcp.tools/mcp", ("tools", "github-mcp", 80)),
        ("https://github-mcp.tools.svc/mcp", ("tools", "github-mcp", 443)),
        ("http://github-mcp.tools.svc.cluster.local:9000/mcp", ("tools", "github-mcp", 9000)),
        ("https://mcp.example.com/mcp", None),  # outside the cluster: the internet rule
        ("http://10.0.0.7:8080/mcp", None),  # an address: no Service to name
        ("http://[fd00::1]:8080/mcp", None),
    ],
)
def test_a_url_names_a_service_only_by_its_cluster_dns_name(
    url: str, expected: tuple[str, str, int] | None
) -> None:
    assert service_of(url, "agents") == expected


def test_a_rule_targets_the_services_pods_on_the_target_port_of_the_port_in_the_url() -> None:
    service: dict[str, Any] = {
        "metadata": {"name": "github-mcp", "namespace": "tools"},
        "spec": {
            "selector": {"app": "github-mcp"},
            "ports": [
                {"port": 8080, "targetPort": "http", "protocol": "TCP"},
                {"port": 9090, "targetPort": 9090},
            ],
        },
    }
    assert rule_for(service, 8080) == {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "tools"}},
                "podSelector": {"matchLabels": {"app": "github-mcp"}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": "http"}],
    }
    assert rule_for(service, 443) is None  # no such port: nothing opens
    without_selector = {**service, "spec": {**service["spec"], "selector": None}}
    assert rule_for(without_selector, 8080) is None  # an ExternalName or manual Endpoints


def create_service(cluster: Cluster, name: str, app: str, port: int, target: int) -> None:
    cluster.core.create_namespaced_service(
        cluster.namespace,
        client.V1Service.model_validate(
            {
                "metadata": {"name": name},
                "spec": {"selector": {"app": app}, "ports": [{"port": port, "targetPort": target}]},
            }
        ),
    )


def egress_rules(cluster: Cluster) -> Callable[[], list[Any] | None]:
    """Reads the rules of the agent's egress policy (None while it does not exist)."""
    policies = client.NetworkingV1Api(cluster.api)

    def rules() -> list[Any] | None:
        try:
            policy = policies.read_namespaced_network_policy("triage-egress", cluster.namespace)
        except client.ApiException:
            return None
        assert policy.spec is not None
        return list(cluster.api.sanitize_for_serialization(policy.spec)["egress"])

    return rules


def pods_of(cluster: Cluster, app: str, port: int) -> dict[str, Any]:
    return {
        "to": [
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": cluster.namespace}
                },
                "podSelector": {"matchLabels": {"app": app}},
            }
        ],
        "ports": [{"protocol": "TCP", "port": port}],
    }


def test_the_egress_policy_reaches_the_mcp_services_and_secrets_reach_only_their_container(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    cluster.secret("mcp", {"token": "Bearer mcp-secret-token"})
    cluster.secret("slack", {"url": "https://hooks.slack.com/services/T/B/x", "signing": "s3"})
    create_service(cluster, "clock-mcp", "clock-mcp", 8000, 8080)
    tools = [
        {"name": "ask", "builtin": "ask_human"},
        {
            "name": "clock",
            "mcp": {
                "url": "http://clock-mcp:8000/mcp",
                "headers": [
                    {"name": "Authorization", "secretRef": {"name": "mcp", "key": "token"}}
                ],
            },
        },
        {
            "name": "files",
            "mcp": {
                "command": ["mcp-server-files"],
                "env": [{"name": "API_TOKEN", "secretRef": {"name": "mcp", "key": "token"}}],
            },
        },
        {"name": "later", "mcp": {"url": "http://later-mcp:8000/mcp"}},  # no such Service, yet
        {"name": "public", "mcp": {"url": "https://mcp.example.com/mcp"}},
    ]
    run_operator(TETHER_MCP_EGRESS_REFRESH="1")
    notify = {
        "format": "slack",
        "urlSecretRef": {"name": "slack", "key": "url"},
        "slackSigningSecretRef": {"name": "slack", "key": "signing"},
    }
    cluster.apply_agent(manifest(tools=tools, approvals={"notify": notify}))
    rules = egress_rules(cluster)
    _dns, *operator_rules, mcp = wait_for(rules, timeout=60, what="the egress policy")
    assert operator_rules == EGRESS_RULES
    assert mcp == pods_of(cluster, "clock-mcp", 8080)

    # A server whose Service comes after the agent is reached once the operator looks again.
    create_service(cluster, "later-mcp", "later", 8000, 9000)
    wait_for(
        lambda: (rules() or [])[-1] == pods_of(cluster, "later", 9000),
        timeout=30,
        what="the rule to a Service created after the agent",
    )
    assert (rules() or [])[-2] == mcp

    # The header's value reaches the worker from its Secret, never through the ConfigMap; Slack's
    # signing secret reaches the sidecar only (it alone verifies clicks).
    def containers(component: str) -> list[Any] | None:
        listed = cluster.apps.list_namespaced_deployment(
            cluster.namespace,
            label_selector=f"tether.dev/agent=triage,app.kubernetes.io/component={component}",
        ).items
        return listed[0].spec.template.spec.containers if listed else None

    [worker] = wait_for(lambda: containers("worker"), timeout=60, what="the worker Deployment")
    sidecar, index = wait_for(lambda: containers("sidecar"), timeout=60, what="the sidecar's")
    assert "TETHER_SLACK_SIGNING_SECRET" not in {e.name for e in index.env}
    env = {e.name: e for e in worker.env}
    for variable in ("TETHER_MCP_CLOCK_AUTHORIZATION", "TETHER_MCP_FILES_API_TOKEN"):
        reference = env[variable].value_from.secret_key_ref
        assert (reference.name, reference.key) == ("mcp", "token")
    assert "TETHER_SLACK_SIGNING_SECRET" not in env
    signing = {e.name: e for e in sidecar.env}["TETHER_SLACK_SIGNING_SECRET"]
    assert (signing.value_from.secret_key_ref.name, signing.value_from.secret_key_ref.key) == (
        "slack",
        "signing",
    )
    assert not {"TETHER_MCP_CLOCK_AUTHORIZATION", "TETHER_MCP_FILES_API_TOKEN"} & {
        e.name for e in sidecar.env
    }
    config_maps = cluster.core.list_namespaced_config_map(
        cluster.namespace, label_selector="tether.dev/agent=triage"
    ).items
    assert len(config_maps) == 2  # the version's and the sidecar's
    assert "mcp-secret-token" not in str([c.data for c in config_maps])


def test_the_operators_trace_collector_is_reached_and_set_on_the_worker(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    """`TETHER_OTLP_ENDPOINT` (the chart's `observability.otlpEndpoint`) at a Service of the
    cluster: the agent's workers export there, and its egress policy lets them (its pods)."""
    with_secrets(cluster)
    create_service(cluster, "otel-collector", "otel", 4318, 4318)
    run_operator(TETHER_OTLP_ENDPOINT="http://otel-collector:4318")
    cluster.apply_agent(manifest())
    rules = egress_rules(cluster)
    _dns, *operator_rules, collector = wait_for(rules, timeout=60, what="the egress policy")
    assert operator_rules == EGRESS_RULES
    assert collector == pods_of(cluster, "otel", 4318)

    def worker_env() -> dict[str, Any] | None:
        listed = cluster.apps.list_namespaced_deployment(
            cluster.namespace,
            label_selector="tether.dev/agent=triage,app.kubernetes.io/component=worker",
        ).items
        if not listed:
            return None
        worker = listed[0].spec.template.spec.containers[0]
        return {e.name: e.value for e in worker.env}

    env = wait_for(worker_env, timeout=60, what="the worker Deployment")
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318"
    assert env["OTEL_SERVICE_NAME"] == "triage"
