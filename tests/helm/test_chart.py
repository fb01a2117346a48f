"""The Helm chart, rendered and linted by the real helm CLI (no cluster needed)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.chart import CHART, REPO, by_kind, env_of, helm, one, pod_specs, render
from tether.programs.restate_identity import public_key_of
from tether.programs.restate_server import EAGER_STATE_LIMIT, STREAMS_PER_CONNECTION
from tether.spec.crd import CRD_NAME, durableagent_crd
from tether_operator.names import version_labels

EXTERNAL = (
    "restate.external.adminUrl=http://r.ns.svc:9070/",
    "restate.external.ingressUrl=http://r.ns.svc:8080",
)


def test_lint_strict(helm_bin: Path) -> None:
    for sets in (
        (),
        EXTERNAL,
        ("operator.watchNamespaces={a,b}", "restate.persistence.enabled=false"),
    ):
        args = ["lint", "--strict", str(CHART)]
        for value in sets:
            args += ["--set", value]
        assert "0 chart(s) failed" in helm(helm_bin, *args).stdout


def test_default_install_renders_the_crd_the_operator_and_restate(helm_bin: Path) -> None:
    objects = render(helm_bin)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "CustomResourceDefinition",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Service",
            "StatefulSet",
            "NetworkPolicy",
            "Secret",
            "PodDisruptionBudget",
            "ClusterKopfPeering",
        ]
    )
    crd = one(objects, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == CRD_NAME
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["spec"] == durableagent_crd()["spec"], "the chart's CRD is crds/durableagent.yaml"

    role = one(objects, "ClusterRole")
    assert role["rules"] == rbac_rules(without="kopfpeerings"), (
        "the chart grants exactly operator/rbac's rules (of the peering kinds, the one it uses)"
    )
    binding = one(objects, "ClusterRoleBinding")
    account = one(objects, "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": "tether-system",
        }
    ]

    operator = one(objects, "Deployment")
    assert operator["spec"]["replicas"] == 2
    assert operator["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = operator["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    container = pod["containers"][0]
    env = env_of(container)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (
        container["image"]
        == env["TETHER_WORKER_IMAGE"]
        == f"ghcr.io/tether-dev/tether:{chart['appVersion']}"
    )
    # The operator reaches the Restate this chart installs, through its Service.
    restate, service = one(objects, "StatefulSet"), one(objects, "Service")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    host = f"http://{service['metadata']['name']}.tether-system.svc"
    assert env["TETHER_RESTATE_ADMIN_URL"] == f"{host}:{ports['admin']}"
    assert env["TETHER_RESTATE_INGRESS_URL"] == f"{host}:{ports['ingress']}"
    assert (
        service["spec"]["selector"].items()
        <= restate["spec"]["template"]["metadata"]["labels"].items()
    )
    assert env["TETHER_NAMESPACES"] == ""
    # The replicas peer through the ClusterKopfPeering of the release; kopf's identity in it is
    # the pod's name.
    peering = one(objects, "ClusterKopfPeering")
    assert env["TETHER_PEERING"] == peering["metadata"]["name"] == "t-operator"
    assert env["TETHER_PEERING_LIFETIME"] == "15"
    [pod_id] = [e for e in container["env"] if e["name"] == "POD_ID"]
    assert pod_id["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    claim = restate["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    restate_env = env_of(restate["spec"]["template"]["spec"]["containers"][0])
    assert restate_env["DO_NOT_TRACK"] == "1"
    # as `tether dev` and the test harness run it: a long session's state is sent on demand
    assert restate_env["RESTATE_WORKER__INVOKER__EAGER_STATE_SIZE_LIMIT"] == EAGER_STATE_LIMIT
    streams = restate_env["RESTATE_WORKER__INVOKER__HTTP2_STREAMS_PER_CONNECTION_LIMIT"]
    assert streams == str(STREAMS_PER_CONNECTION)


@pytest.mark.parametrize(
    "sets",
    [
        (),
        EXTERNAL,
        ("restate.persistence.enabled=false", "operator.watchNamespaces={a}"),
        ("restate.replicas=3",),
    ],
    ids=["default", "external-restate", "no-persistence", "restate-cluster"],
)
def test_every_pod_meets_the_restricted_pod_security_standard(
    helm_bin: Path, sets: tuple[str, ...]
) -> None:
    specs = list(pod_specs(render(helm_bin, *sets)))
    assert specs
    for name, spec in specs:
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["seccompProfile"]["type"] == "RuntimeDefault", (
            name
        )
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), name
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["capabilities"]["drop"] == ["ALL"], name
            assert "add" not in security["capabilities"], name
            assert container["resources"]["limits"]["memory"], name
        volumes = [v for v in spec.get("volumes", []) if "hostPath" in v]
        assert volumes == [], name


def test_an_existing_restate_takes_two_values(helm_bin: Path) -> None:
    objects = render(helm_bin, *EXTERNAL)
    assert by_kind(objects, "StatefulSet") == [] and by_kind(objects, "Service") == []
    assert by_kind(objects, "Secret") == []  # its signing key is its own
    env = env_of(one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["TETHER_RESTATE_ADMIN_URL"] == "http://r.ns.svc:9070"
    assert env["TETHER_RESTATE_INGRESS_URL"] == "http://r.ns.svc:8080"
    assert (
        "TETHER_RESTATE_IDENTITY_KEYS" not in env and "TETHER_RESTATE_IDENTITY_KEY_FILE" not in env
    )
    key = "publickeyv1_BBPebL4tewPdYRNFbd3ZB4XPbEv3xKFByE4TcbCM7kNt"
    signed = render(helm_bin, *EXTERNAL, f"restate.external.identityPublicKey={key}")
    env = env_of(one(signed, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["TETHER_RESTATE_IDENTITY_KEYS"] == key


def test_restate_signs_its_requests_with_a_key_the_operator_reads(helm_bin: Path) -> None:
    """Restate signs every request to a worker with the Secret's key; the operator derives the
    public key the workers check with from the same Secret (tether.programs.restate_identity)."""
    objects = render(helm_bin)
    [secret] = by_kind(objects, "Secret")
    pem = base64.b64decode(secret["data"]["private.pem"])
    assert public_key_of(pem).startswith("publickeyv1_")  # an Ed25519 key Restate can load
    name = secret["metadata"]["name"]
    restate_pod = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    operator_pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    for pod, variable in [
        (restate_pod, "RESTATE_REQUEST_IDENTITY_PRIVATE_KEY_PEM_FILE"),
        (operator_pod, "TETHER_RESTATE_IDENTITY_KEY_FILE"),
    ]:
        [volume] = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == name]
        [container] = pod["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert env_of(container)[variable] == f"{mount['mountPath']}/private.pem"
        assert mount["readOnly"] and volume["secret"]["defaultMode"] == 0o440
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    unsigned = render(helm_bin, "restate.requestIdentity=false")
    assert by_kind(unsigned, "Secret") == []
    env = env_of(one(unsigned, "StatefulSet")["spec"]["template"]["spec"]["containers"][0])
    assert "RESTATE_REQUEST_IDENTITY_PRIVATE_KEY_PEM_FILE" not in env


def test_watched_namespaces_get_role_bindings_only(helm_bin: Path) -> None:
    objects = render(helm_bin, "operator.watchNamespaces={team-a,team-b}")
    assert by_kind(objects, "ClusterRoleBinding") == []
    bindings = by_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(b["roleRef"]["kind"] == "ClusterRole" for b in bindings)
    # Peering through a KopfPeering in each watched namespace; no cluster-wide peering rule.
    assert by_kind(objects, "ClusterKopfPeering") == []
    peerings = by_kind(objects, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert {p["metadata"]["name"] for p in peerings} == {"t-operator"}
    assert one(objects, "ClusterRole")["rules"] == rbac_rules(without="clusterkopfpeerings")
    env = env_of(one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["TETHER_NAMESPACES"] == "team-a,team-b"


def rbac_rules(without: str, peering: str = "t-operator") -> list[dict[str, Any]]:
    """operator/rbac/clusterrole.yaml's rules but the one for the peering kind `without`, and
    the other peering kind's patch limited to the object named `peering`."""
    source = yaml.safe_load((REPO / "operator" / "rbac" / "clusterrole.yaml").read_text())
    rules: list[dict[str, Any]] = []
    for rule in source["rules"]:
        if without in rule["resources"]:
            continue
        if rule["apiGroups"] == ["kopf.dev"]:
            assert "patch" in rule["verbs"]
            read = [verb for verb in rule["verbs"] if verb != "patch"]
            rules.append({**rule, "verbs": read})
            rules.append({**rule, "resourceNames": [peering], "verbs": ["patch"]})
            continue
        rules.append(rule)
    assert len(rules) == len(source["rules"])
    return rules


def test_the_operator_runs_in_high_availability(helm_bin: Path) -> None:
    """Two peering replicas, spread over nodes where there are several, one kept up by a
    PodDisruptionBudget; kopf's peering CRDs come from the chart's crds/ (installed if absent)."""
    objects = render(helm_bin)
    operator = one(objects, "Deployment")
    pod = operator["spec"]["template"]
    [preferred] = pod["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in str(pod["spec"]["affinity"])
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == operator["spec"]["selector"]
    # One replica: no budget (it would block a node drain), the same peering.
    single = render(helm_bin, "operator.replicas=1")
    assert by_kind(single, "PodDisruptionBudget") == []
    assert one(single, "ClusterKopfPeering")["metadata"]["name"] == "t-operator"
    # An affinity of one's own replaces the default.
    mine = render(helm_bin, "operator.affinity.nodeAffinity.x=1")
    assert one(mine, "Deployment")["spec"]["template"]["spec"]["affinity"] == {
        "nodeAffinity": {"x": 1}
    }
    lifetime = render(helm_bin, "operator.peering.lifetime=30")
    env = env_of(one(lifetime, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["TETHER_PEERING_LIFETIME"] == "30"
    # The CRDs: kopf's definitions, as crds/kopfpeering.yaml has them.
    args = ["template", "t", str(CHART), "--include-crds"]
    rendered = [d for d in yaml.safe_load_all(helm(helm_bin, *args).stdout) if d]
    crds = {c["metadata"]["name"]: c for c in by_kind(rendered, "CustomResourceDefinition")}
    source = list(yaml.safe_load_all((REPO / "crds" / "kopfpeering.yaml").read_text()))
    for crd in source:
        assert crds[crd["metadata"]["name"]] == crd
        assert "subresources" not in crd["spec"]["versions"][0]  # kopf patches the object
    assert {c["spec"]["names"]["kind"] for c in source} == {"KopfPeering", "ClusterKopfPeering"}


def test_pod_monitors_select_the_agents_the_operator_and_restate(helm_bin: Path) -> None:
    assert by_kind(render(helm_bin), "PodMonitor") == []  # off by default: needs their CRD
    objects = render(helm_bin, "monitoring.podMonitors=true", "operator.watchNamespaces={a,b}")
    agents, operator, restate = by_kind(objects, "PodMonitor")
    # The operator's worker pods carry these labels (tether_operator.render).
    pod_labels = version_labels("clerk", "0123456789")
    assert agents["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert agents["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}
    # The sidecar pods' `http` port and the worker pods' `metrics` port (both in test_children).
    assert agents["spec"]["podMetricsEndpoints"] == [
        {"port": port, "path": "/metrics", "interval": "30s"} for port in ("http", "metrics")
    ]
    statefulset = one(objects, "StatefulSet")
    assert (
        restate["spec"]["selector"]["matchLabels"].items()
        <= statefulset["spec"]["template"]["metadata"]["labels"].items()
    )
    ports = {p["name"] for p in statefulset["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert restate["spec"]["podMetricsEndpoints"][0]["port"] in ports
    # The operator's gauges per version (scale to zero, an HPA or KEDA) on its metrics port.
    pod = one(objects, "Deployment")["spec"]["template"]
    assert operator["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [container] = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert operator["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert str(ports["metrics"]) == env_of(container)["TETHER_METRICS_PORT"] == "8000"
    external = render(helm_bin, "monitoring.podMonitors=true", *EXTERNAL)
    names = [m["metadata"]["name"] for m in by_kind(external, "PodMonitor")]
    assert names == ["t-agents", "t-operator"]


def test_restate_is_open_to_the_operator_the_agents_and_listed_namespaces_only(
    helm_bin: Path,
) -> None:
    objects = render(helm_bin)
    policy = one(objects, "NetworkPolicy")
    restate_pod = one(objects, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= restate_pod.items()
    admin, ingress = policy["spec"]["ingress"]
    assert admin["ports"] == [{"port": "admin"}] and ingress["ports"] == [{"port": "ingress"}]
    operator_pod = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    # The admin API reads and kills every agent's runs: the operator only, not the agents'
    # pods, whose tools share their network.
    [operator_peer] = admin["from"]
    assert "namespaceSelector" not in operator_peer  # the operator's own namespace only
    assert operator_peer["podSelector"]["matchLabels"].items() <= operator_pod.items()
    # No other namespace reaches the ingress unless listed: it starts any agent's runs.
    [also_operator, agent_peer] = ingress["from"]
    assert also_operator == operator_peer
    agent_pod = version_labels("clerk", "0123456789")
    assert agent_peer["podSelector"]["matchLabels"].items() <= agent_pod.items()

    narrowed = render(
        helm_bin,
        "restate.networkPolicy.ingressFromNamespaces={apps}",
        "operator.watchNamespaces={team-a,team-b}",
    )
    _, ingress = one(narrowed, "NetworkPolicy")["spec"]["ingress"]
    agents_in = {"key": "kubernetes.io/metadata.name", "operator": "In"}
    assert ingress["from"][1]["namespaceSelector"]["matchExpressions"] == [
        {**agents_in, "values": ["team-a", "team-b"]}
    ]
    assert ingress["from"][2] == {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}
    }
    scraped = render(helm_bin, "monitoring.podMonitors=true")
    assert len(one(scraped, "NetworkPolicy")["spec"]["ingress"]) == 3
    assert by_kind(render(helm_bin, "restate.networkPolicy.enabled=false"), "NetworkPolicy") == []
    assert by_kind(render(helm_bin, *EXTERNAL), "NetworkPolicy") == []


def test_a_default_trace_collector_reaches_the_operator(helm_bin: Path) -> None:
    """The operator gives it to every agent's worker that names none itself."""
    env = env_of(one(render(helm_bin), "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert "TETHER_OTLP_ENDPOINT" not in env
    endpoint = "http://otel-collector.observability:4318"
    objects = render(helm_bin, f"observability.otlpEndpoint={endpoint}")
    env = env_of(one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["TETHER_OTLP_ENDPOINT"] == endpoint


def test_without_crds(helm_bin: Path) -> None:
    assert by_kind(render(helm_bin, "crds.install=false"), "CustomResourceDefinition") == []


BAD_VALUES = {
    "one external url": (
        ("restate.external.adminUrl=http://r:9070",),
        "set both adminUrl and ingressUrl",
    ),
    "replicas": (("operator.replicas=-1",), "/operator/replicas"),
    "peering lifetime": (("operator.peering.lifetime=2",), "/operator/peering/lifetime"),
    "pull policy": (("image.pullPolicy=Sometimes",), "/image/pullPolicy"),
    "namespace name": (("operator.watchNamespaces={Team_A}",), "/operator/watchNamespaces/0"),
    "unknown value": (("operator.replica=1",), "replica"),
    "interval": (("operator.reconcileInterval=0",), "/operator/reconcileInterval"),
    "service type": (("operator.workerServiceType=LoadBalancer",), "/operator/workerServiceType"),
    "volume size": (("restate.persistence.size=lots",), "/restate/persistence/size"),
    "eager state": (("restate.eagerStateLimit=lots",), "/restate/eagerStateLimit"),
    "identity key": (
        ("restate.external.identityPublicKey=ed25519:abc",),
        "/restate/external/identityPublicKey",
    ),
    "restate url": (
        ("restate.external.adminUrl=r:9070", "restate.external.ingressUrl=r:8080"),
        "adminUrl",
    ),
    "otlp endpoint": (("observability.otlpEndpoint=otel:4318",), "/observability/otlpEndpoint"),
}


@pytest.mark.parametrize("case", list(BAD_VALUES), ids=list(BAD_VALUES))
def test_bad_values_are_refused_naming_the_value(helm_bin: Path, case: str) -> None:
    sets, named = BAD_VALUES[case]
    args = ["template", "t", str(CHART)]
    for value in sets:
        args += ["--set", value]
    result = helm(helm_bin, *args, check=False)
    assert result.returncode != 0
    assert named in result.stderr, result.stderr


def test_the_agents_egress_is_dns_restate_and_the_internet_outside_private_ranges(
    helm_bin: Path,
) -> None:
    """The operator gives each agent's pods these egress rules (after DNS): what its tools reach."""

    def rules(*values: str) -> list[dict[str, Any]] | None:
        env = env_of(
            one(render(helm_bin, *values), "Deployment")["spec"]["template"]["spec"]["containers"][
                0
            ]
        )
        raw = env.get("TETHER_AGENT_EGRESS")
        return None if raw is None else json.loads(raw)

    restate, internet = rules() or []
    [peer] = restate["to"]
    assert peer["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "tether-system"}
    }
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == "restate"
    assert restate["ports"] == [{"protocol": "TCP", "port": 8080}]
    [block] = internet["to"]
    assert block["ipBlock"]["cidr"] == "0.0.0.0/0"
    assert {"10.0.0.0/8", "169.254.0.0/16"} <= set(block["ipBlock"]["except"])
    assert internet["ports"] == [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 80}]
    # A Restate of your own is one of your extra rules; and the policy can be left out.
    gateway = {"to": [{"podSelector": {"matchLabels": {"app": "gateway"}}}]}
    external = rules(
        *EXTERNAL, "agents.egress.extraRules[0].to[0].podSelector.matchLabels.app=gateway"
    )
    assert external is not None and external[-1] == gateway and len(external) == 2
    assert rules("agents.egress.enabled=false") is None
