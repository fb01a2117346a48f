"""Operator settings and version identity, without a cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tether.spec import SpecError, parse_agent
from tether_operator.render import egress_policy, sidecar_objects, version_hash, version_objects
from tether_operator.settings import SettingsError, settings_from_env

ENV = {
    "TETHER_RESTATE_ADMIN_URL": "http://restate.restate.svc:9070/",
    "TETHER_RESTATE_INGRESS_URL": "http://restate.restate.svc:8080",
    "TETHER_WORKER_IMAGE": "ghcr.io/example/tether:1.0",
}


def agent(**spec: Any) -> Any:
    return parse_agent(
        {
            "apiVersion": "tether.dev/v1alpha1",
            "kind": "DurableAgent",
            "metadata": {"name": "triage"},
            "spec": {"model": {"provider": "anthropic", "name": "c"}, **spec},
        }
    )


def test_required_settings_are_named_when_missing() -> None:
    with pytest.raises(SettingsError, match="TETHER_RESTATE_ADMIN_URL, TETHER_WORKER_IMAGE"):
        settings_from_env({"TETHER_RESTATE_INGRESS_URL": "http://x"})


def test_defaults_and_parsing() -> None:
    settings = settings_from_env({**ENV, "TETHER_NAMESPACES": "a, b", "TETHER_EXTRA_LABELS": "t=1"})
    assert settings.restate_admin_url == "http://restate.restate.svc:9070"
    assert settings.namespaces == ("a", "b")
    assert settings.labels == {"t": "1"}
    assert settings.metrics_port == 8000
    assert settings_from_env({**ENV, "TETHER_METRICS_PORT": "0"}).metrics_port == 0
    url = settings.worker_url(
        service="triage-abc", namespace="ns", agent="triage", hash="abc", port=9080, node_port=""
    )
    assert url == "http://triage-abc.ns.svc:9080"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TETHER_WORKER_URL_TEMPLATE", "http://{host}:1", "unknown fields ['host']"),
        ("TETHER_WORKER_SERVICE_TYPE", "LoadBalancer", "ClusterIP or NodePort"),
        ("TETHER_RECONCILE_INTERVAL", "soon", "not a number"),
        ("TETHER_EXTRA_LABELS", "novalue", "not key=value"),
        ("TETHER_AGENT_EGRESS", "[{", "TETHER_AGENT_EGRESS is not JSON"),
        ("TETHER_AGENT_EGRESS", '{"to": []}', "a JSON list of NetworkPolicy egress rules"),
        ("TETHER_OTLP_ENDPOINT", "otel:4318", "TETHER_OTLP_ENDPOINT must be the http://"),
        ("TETHER_OTLP_ENDPOINT", "http://u:p@otel:4318", "without user information"),
        ("TETHER_OTLP_ENDPOINT", "http://otel:4318/?k=v", "must not carry a query"),
        ("TETHER_METRICS_PORT", "http", "not a port number"),
        ("TETHER_METRICS_PORT", "70000", "not a port number"),
        ("TETHER_PEERING", "Tether_Operator", "not a Kubernetes object name"),
        ("TETHER_PEERING_LIFETIME", "3", "at least 5"),
        ("TETHER_PEERING_LIFETIME", "15.5", "whole number of seconds"),
        ("TETHER_PEERING_PRIORITY", "high", "not an integer"),
    ],
)
def test_bad_settings_say_what_is_wrong(name: str, value: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("[", r"\[")):
        settings_from_env({**ENV, name: value})


def test_peering_is_off_unless_named() -> None:
    """Standalone by default (one replica: `tether dev`, the tests); the chart names it."""
    settings = settings_from_env(ENV)
    assert settings.peering is None and settings.peering_lifetime == 15
    assert settings.peering_priority is None
    peered = settings_from_env(
        {
            **ENV,
            "TETHER_PEERING": "tether-operator",
            "TETHER_PEERING_LIFETIME": "30",
            "TETHER_PEERING_PRIORITY": "-7",
        }
    )
    assert peered.peering == "tether-operator" and peered.peering_lifetime == 30
    assert peered.peering_priority == -7
    # Replicas render the same versions, whatever their peering settings.
    assert version_hash(agent(), "ns", peered) == version_hash(agent(), "ns", settings)


def test_the_version_follows_the_spec_and_pod_template_only() -> None:
    settings = settings_from_env(ENV)
    base = version_hash(agent(), "ns", settings)
    assert base == version_hash(agent(), "ns", settings)
    assert len(base) == 10 and base.isalnum()
    # How versions are run is not what runs: no new version.
    assert version_hash(agent(drain={"delay": "1s"}), "ns", settings) == base
    assert version_hash(agent(worker={"replicas": 3}), "ns", settings) == base
    scaling = {"idleAfter": "10m", "minReplicas": 1, "maxReplicas": 4}
    assert version_hash(agent(scaling=scaling), "ns", settings) == base
    # Nor when it runs: schedules are kept on Restate, and no pod (the sidecar's neither) reads
    # them.
    hook = {"secretRef": {"name": "hook", "key": "key"}}
    daily = [{"name": "daily", "cron": "@daily", "prompt": "sum up the day"}]
    signed, scheduled = agent(webhook=hook), agent(webhook=hook, schedules=daily)
    assert version_hash(scheduled, "ns", settings) == version_hash(signed, "ns", settings)
    assert (
        sidecar_objects(scheduled, "ns", settings).hash
        == sidecar_objects(signed, "ns", settings).hash
    )
    # What runs is.
    assert version_hash(agent(system="x"), "ns", settings) != base
    assert version_hash(agent(worker={"image": "other:1"}), "ns", settings) != base
    other_image = settings_from_env({**ENV, "TETHER_WORKER_IMAGE": "ghcr.io/example/tether:2"})
    assert version_hash(agent(), "ns", other_image) != base
    objects = version_objects(agent(worker={"replicas": 3}), "ns", settings)
    assert objects.deployment["spec"]["replicas"] == 3
    assert objects.name == f"triage-{base}"


def test_a_workspace_claim_is_the_workspace_of_every_pod_and_a_new_version() -> None:
    settings = settings_from_env(ENV)

    def volumes(objects: Any) -> dict[str, Any]:
        spec = objects.deployment["spec"]["template"]["spec"]
        return {volume["name"]: volume for volume in spec["volumes"]}

    assert volumes(version_objects(agent(), "ns", settings))["workspace"] == {
        "name": "workspace",
        "emptyDir": {},
    }
    claimed = version_objects(agent(worker={"workspaceClaim": "files"}), "ns", settings)
    assert volumes(claimed)["workspace"] == {
        "name": "workspace",
        "persistentVolumeClaim": {"claimName": "files"},
    }
    assert claimed.hash != version_hash(agent(), "ns", settings)
    with pytest.raises(SpecError, match="workspaceClaim"):
        agent(worker={"workspaceClaim": "Not/A-Name"})


def test_a_versions_workers_spread_over_nodes_and_a_drain_evicts_one_at_a_time() -> None:
    objects = version_objects(agent(worker={"replicas": 2}), "ns", settings_from_env(ENV))
    pods = {"tether.dev/agent": "triage", "tether.dev/version": objects.hash}
    [spread] = objects.deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # one node still schedules them all
    assert spread["labelSelector"] == {"matchLabels": pods}
    budget = objects.disruption_budget
    assert budget["kind"] == "PodDisruptionBudget" and budget["metadata"]["name"] == objects.name
    # maxUnavailable, not minAvailable: a version of one replica never blocks a drain.
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": pods}}


def test_the_command_stops_with_a_clear_message_without_settings() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tether_operator"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "TETHER_RESTATE_ADMIN_URL" in done.stderr and "Traceback" not in done.stderr


def test_an_agent_gets_an_egress_policy_only_when_the_operator_has_rules() -> None:
    assert egress_policy("triage", "ns", settings_from_env(ENV)) is None
    rule = {"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": [{"port": 443}]}
    settings = settings_from_env({**ENV, "TETHER_AGENT_EGRESS": json.dumps([rule])})
    policy = egress_policy("triage", "ns", settings)
    assert policy is not None and policy["metadata"]["name"] == "triage-egress"
    assert policy["spec"]["podSelector"] == {"matchLabels": {"tether.dev/agent": "triage"}}
    dns, extra = policy["spec"]["egress"]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert extra == rule


def worker_env(objects: Any) -> list[tuple[str, str]]:
    [worker] = [
        c
        for c in objects.deployment["spec"]["template"]["spec"]["containers"]
        if c["name"] == "worker"
    ]
    return [(e["name"], e.get("value", "")) for e in worker["env"]]


def test_the_worker_exports_traces_to_the_agents_collector_or_the_operators() -> None:
    """`spec.observability.otlpEndpoint`, else the operator's default (the chart's value), in
    the worker's standard OpenTelemetry variables; neither: none, and the version is as before."""
    settings = settings_from_env(ENV)
    untraced = worker_env(version_objects(agent(), "ns", settings))
    assert not [name for name, _ in untraced if name.startswith("OTEL_")]

    own = agent(observability={"otlpEndpoint": "http://otel.obs:4318"})
    env = worker_env(version_objects(own, "ns", settings))
    assert ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel.obs:4318") in env
    assert ("OTEL_SERVICE_NAME", "triage") in env
    assert version_hash(own, "ns", settings) != version_hash(agent(), "ns", settings)

    default = settings_from_env({**ENV, "TETHER_OTLP_ENDPOINT": "http://collector.mon:4318"})
    assert default.otlp_endpoint == "http://collector.mon:4318"
    env = worker_env(version_objects(agent(), "ns", default))
    assert ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.mon:4318") in env
    env = worker_env(version_objects(own, "ns", default))  # the agent's own wins
    assert [v for n, v in env if n == "OTEL_EXPORTER_OTLP_ENDPOINT"] == ["http://otel.obs:4318"]

    # The agent's worker.env wins over both (here: a service name of its own).
    off = agent(worker={"env": [{"name": "OTEL_SERVICE_NAME", "value": "mine"}]})
    env = worker_env(version_objects(off, "ns", default))
    assert [v for n, v in env if n == "OTEL_SERVICE_NAME"] == ["mine"]


def test_an_otlp_endpoint_with_credentials_is_refused_by_the_spec() -> None:
    with pytest.raises(SpecError, match=r"spec\.observability\.otlpEndpoint"):
        agent(observability={"otlpEndpoint": "http://user:secret@otel:4318"})
    with pytest.raises(SpecError, match=r"spec\.observability\.otlpEndpoint"):
        agent(observability={"otlpEndpoint": "otel:4318"})


def test_a_worker_pod_waits_for_its_calls_in_flight_as_long_as_the_spec_says() -> None:
    """A stopping worker (a rollout, a scale-down) lets the turn in flight finish: the pod's
    grace period is the spec's (`tether.spec.stopping`), the worker's graceful timeout under it."""
    settings = settings_from_env(ENV)
    slow = {"name": "slow", "python": "tools:slow", "timeout": "10m"}
    for own, graceful, pod in (
        ({"tools": [slow]}, "768.84", 774),  # 4096 tokens at 25/s, the tool's 10 minutes, 5 s
        ({"worker": {"stopGracePeriod": "2m"}}, "120", 125),
    ):
        objects = version_objects(agent(**own), "ns", settings)
        template = objects.deployment["spec"]["template"]["spec"]
        assert template["terminationGracePeriodSeconds"] == pod
        assert ("TETHER_WORKER_GRACEFUL_TIMEOUT", graceful) in worker_env(objects)
    mine = agent(worker={"env": [{"name": "TETHER_WORKER_GRACEFUL_TIMEOUT", "value": "7"}]})
    env = worker_env(version_objects(mine, "ns", settings))
    assert [v for n, v in env if n == "TETHER_WORKER_GRACEFUL_TIMEOUT"] == ["7"]
