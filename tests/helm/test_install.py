"""`helm install` of the chart on the tier-2 control plane (kwok makes the pods Ready), into a
namespace that enforces the restricted Pod Security Standard: the release only becomes ready if
the API server admitted every pod of it."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helm.chart import CHART, REPO, helm, one, render
from tests.kube.controlplane import ControlPlane
from tether.spec.crd import CRD_NAME

RESTRICTED = "pod-security.kubernetes.io/enforce=restricted"
E2E_AGENT = REPO / "e2e" / "agent.yaml"


@pytest.fixture
def namespace(kube_cluster: ControlPlane) -> Iterator[str]:
    name = f"tether-helm-{uuid.uuid4().hex[:6]}"
    kube_cluster.kubectl("create", "namespace", name)
    kube_cluster.kubectl("label", "namespace", name, RESTRICTED)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def adopt_crd(kube: ControlPlane, release: str, namespace: str) -> None:
    """Earlier tests of the session may have applied the CRD without Helm: hand it to the
    release, as an operator of a cluster would when moving to the chart."""
    if kube.kubectl("get", "crd", CRD_NAME, check=False).returncode != 0:
        return
    kube.kubectl("label", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm", "--overwrite")
    kube.kubectl(
        "annotate",
        "crd",
        CRD_NAME,
        f"meta.helm.sh/release-name={release}",
        f"meta.helm.sh/release-namespace={namespace}",
        "--overwrite",
    )


def can(kube: ControlPlane, account: str, verb: str, resource: str, namespace: str) -> bool:
    result = kube.kubectl(
        "auth", "can-i", verb, resource, "-n", namespace, f"--as={account}", check=False
    )
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


def test_install_upgrade_uninstall(
    helm_bin: Path,
    kube_cluster: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    kube = kube_cluster
    env = kube.env() | {
        f"HELM_{kind}_HOME": str(tmp_path / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")
    }
    release = namespace  # cluster-scoped names (ClusterRole, bindings) carry the release name
    # The namespace really enforces the restricted standard: a root pod is refused.
    root_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    refused = kube.kubectl("create", "-f", "-", input=json.dumps(root_pod), check=False)
    assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stderr

    adopt_crd(kube, release, namespace)
    install = [
        "install", release, str(CHART), "-n", namespace,
        "--set", "restate.persistence.enabled=false",
        "--set", f"operator.watchNamespaces={{{namespace}}}",
        "--wait", "--timeout", "180s",
    ]  # fmt: skip
    helm(helm_bin, *install, env=env)

    # Everything the release runs is up: the API server admitted its pods.
    operator, restate = f"{release}-operator", f"{release}-restate"
    kube.kubectl("-n", namespace, "rollout", "status", f"deployment/{operator}", "--timeout=60s")
    kube.kubectl("-n", namespace, "rollout", "status", f"statefulset/{restate}", "--timeout=60s")
    kube.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    crd = json.loads(kube.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # The agent e2e/kind.sh applies is accepted by the installed CRD (schema and CEL rules).
    agent = kube.kubectl("-n", namespace, "apply", "--dry-run=server", "-f", str(E2E_AGENT))
    assert "e2e-clerk created (server dry run)" in agent.stdout

    # Least privilege, in the watched namespace only.
    account = f"system:serviceaccount:{namespace}:{operator}"
    assert can(kube, account, "patch", "durableagents.tether.dev", namespace)
    assert can(kube, account, "create", "deployments.apps", namespace)
    assert can(kube, account, "get", "secrets", namespace)
    assert not can(kube, account, "list", "secrets", namespace)
    assert not can(kube, account, "get", "pods", namespace)
    assert not can(kube, account, "delete", "namespaces", namespace)
    assert not can(kube, account, "create", "clusterroles.rbac.authorization.k8s.io", namespace)
    assert not can(kube, account, "patch", "durableagents.tether.dev", "default")
    # Peering: its KopfPeering in the watched namespace, listed, watched and patched only.
    peering = ["-n", namespace, "get", "kopfpeering", operator, "-o", "name"]
    assert kube.kubectl(*peering).stdout.strip() == f"kopfpeering.kopf.dev/{operator}"
    for verb in ("list", "watch"):
        assert can(kube, account, verb, "kopfpeerings.kopf.dev", namespace)
    for verb in ("get", "create", "delete"):
        assert not can(kube, account, verb, "kopfpeerings.kopf.dev", namespace)
    assert can(kube, account, "patch", f"kopfpeerings.kopf.dev/{operator}", namespace)
    # Not another operator's (kopf's priority 100 in one would pause every replica of it).
    assert not can(kube, account, "patch", "kopfpeerings.kopf.dev/other-operator", namespace)
    assert not can(kube, account, "patch", f"kopfpeerings.kopf.dev/{operator}", "default")
    assert not can(kube, account, "patch", "clusterkopfpeerings.kopf.dev", namespace)

    # Watching all namespaces is one value away; Restate's signing key stays what it was (the
    # workers registered so far check with its public half).
    identity = ["-n", namespace, "get", "secret", f"{restate}-identity"]
    key = json.loads(kube.kubectl(*identity, "-o", "json").stdout)["data"]["private.pem"]
    upgrade = ["upgrade", release, str(CHART), "-n", namespace, "--wait", "--timeout", "120s"]
    upgrade += ["--set", "restate.persistence.enabled=false"]
    helm(helm_bin, *upgrade, env=env)
    assert json.loads(kube.kubectl(*identity, "-o", "json").stdout)["data"]["private.pem"] == key
    assert can(kube, account, "patch", "durableagents.tether.dev", "default")
    assert not can(kube, account, "list", "secrets", "default")
    # Cluster-wide, the replicas peer through the release's ClusterKopfPeering instead.
    assert kube.kubectl("get", "clusterkopfpeering", operator, "-o", "name").returncode == 0
    assert can(kube, account, "patch", f"clusterkopfpeerings.kopf.dev/{operator}", namespace)
    assert not can(kube, account, "patch", "clusterkopfpeerings.kopf.dev/other-operator", namespace)
    assert not can(kube, account, "patch", f"kopfpeerings.kopf.dev/{operator}", "default")

    # Uninstalling removes the platform but keeps the CRD (and so every DurableAgent).
    helm(helm_bin, "uninstall", release, "-n", namespace, "--wait", env=env)
    assert kube.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0
    left = kube.kubectl("-n", namespace, "get", "deployments,statefulsets,services", "-o", "name")
    assert left.stdout.strip() == ""
    gone = kube.kubectl("get", "clusterrolebinding", operator, check=False)
    assert gone.returncode != 0
    assert kube.kubectl("get", "clusterkopfpeering", operator, check=False).returncode != 0


def test_helm_is_the_pinned_build(helm_bin: Path) -> None:
    version = subprocess.run([str(helm_bin), "version", "--short"], capture_output=True, text=True)
    assert version.stdout.startswith("v3.22.0"), version.stdout


def install_operator_crd(kube: ControlPlane, crds: Path, plural: str) -> None:
    """The Prometheus Operator's CRD of `plural` (from `crds`), applied and established."""
    crd = crds / f"monitoring.coreos.com_{plural}.yaml"
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd))
    kube.kubectl(
        "wait",
        "--for=condition=Established",
        f"crd/{plural}.monitoring.coreos.com",
        "--timeout=45s",
    )


def test_the_pod_monitors_are_valid_for_the_prometheus_operator_crd(
    helm_bin: Path,
    kube_cluster: ControlPlane,
    prometheus_operator_crds: Path,
    namespace: str,
) -> None:
    kube = kube_cluster
    install_operator_crd(kube, prometheus_operator_crds, "podmonitors")
    monitors = [
        o
        for o in render(helm_bin, "monitoring.podMonitors=true", namespace=namespace)
        if o["kind"] == "PodMonitor"
    ]
    assert len(monitors) == 3  # the agents, the operator, Restate
    for monitor in monitors:
        checked = kube.kubectl(
            "apply", "--dry-run=server", "-f", "-", input=json.dumps(monitor), check=False
        )
        assert checked.returncode == 0, checked.stderr
        assert "created (server dry run)" in checked.stdout
    # The schema is really enforced: a PodMonitor with a bad endpoint is refused.
    broken = {**monitors[0], "spec": {**monitors[0]["spec"], "podMetricsEndpoints": [{"port": 1}]}}
    refused = kube.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(broken), check=False
    )
    assert refused.returncode != 0


def test_the_rule_is_valid_for_the_prometheus_operator_crd(
    helm_bin: Path, kube_cluster: ControlPlane, prometheus_operator_crds: Path, namespace: str
) -> None:
    kube = kube_cluster
    install_operator_crd(kube, prometheus_operator_crds, "prometheusrules")
    rule = one(
        render(helm_bin, "monitoring.alerts.enabled=true", namespace=namespace), "PrometheusRule"
    )
    checked = kube.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(rule), check=False
    )
    assert checked.returncode == 0, checked.stderr
    # The schema is really enforced: a rule without its expression is refused.
    broken = json.loads(json.dumps(rule))
    del broken["spec"]["groups"][0]["rules"][0]["expr"]
    refused = kube.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(broken), check=False
    )
    assert refused.returncode != 0


def test_a_restate_cluster_installs_under_the_restricted_standard(
    helm_bin: Path,
    kube_cluster: ControlPlane,
    namespace: str,
    tmp_path: Path,
) -> None:
    """`restate.replicas=3`: the API server takes every object of the cluster (StatefulSet,
    headless Service, ConfigMap, PodDisruptionBudget, NetworkPolicy) and admits its three pods
    in a namespace that enforces the restricted standard; kwok makes them Ready. A release with
    a single node is not turned into a cluster by `helm upgrade`: the API server refuses the
    StatefulSet's new service name and pod management (helm/README.md says what to do)."""
    kube = kube_cluster
    env = kube.env() | {
        f"HELM_{kind}_HOME": str(tmp_path / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")
    }
    release = namespace
    adopt_crd(kube, release, namespace)
    install = [
        "install", release, str(CHART), "-n", namespace,
        "--set", "restate.persistence.enabled=false",
        "--set", f"operator.watchNamespaces={{{namespace}}}",
        "--wait", "--timeout", "180s",
    ]  # fmt: skip
    helm(helm_bin, *install, env=env)
    upgrade = ["upgrade", release, str(CHART), "-n", namespace, "--reuse-values"]
    refused = helm(helm_bin, *upgrade, "--set", "restate.replicas=3", env=env, check=False)
    assert refused.returncode != 0
    assert "StatefulSet" in refused.stderr and "Forbidden" in refused.stderr, refused.stderr
    helm(helm_bin, "uninstall", release, "-n", namespace, "--wait", env=env)

    installed = helm(helm_bin, *install, "--set", "restate.replicas=3", env=env)
    assert "Restate nodes:   3, each partition on 2 of them" in installed.stdout
    restate = f"{release}-restate"
    kube.kubectl("-n", namespace, "rollout", "status", f"statefulset/{restate}", "--timeout=60s")
    pods = json.loads(
        kube.kubectl(
            "-n", namespace, "get", "pods", "-l", "app.kubernetes.io/name=restate", "-o", "json"
        ).stdout
    )
    assert sorted(p["metadata"]["name"] for p in pods["items"]) == [
        f"{restate}-{i}" for i in range(3)
    ]
    budget = json.loads(kube.kubectl("-n", namespace, "get", "pdb", restate, "-o", "json").stdout)
    assert budget["spec"]["maxUnavailable"] == 1
    headless = ["-n", namespace, "get", "service", f"{restate}-cluster", "-o", "json"]
    assert json.loads(kube.kubectl(*headless).stdout)["spec"]["clusterIP"] == "None"
    helm(helm_bin, "uninstall", release, "-n", namespace, "--wait", env=env)
