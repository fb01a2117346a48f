"""The operator works with nothing but the rules in operator/rbac/, bound in its namespace, with
peering on (as the chart runs it): kopf keeps its record in the namespace's KopfPeering."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from kubernetes import client

from tests.kube.controlplane import ControlPlane
from tests.operator.op_harness import (
    REPO,
    Cluster,
    OperatorFactory,
    Restate,
    finalize_agents,
    wait_for,
)
from tests.operator.test_children import AGENT, manifest, registered, with_secrets

RBAC = REPO / "operator" / "rbac"
PEERING = "tether-operator"


def service_account_kubeconfig(cluster: Cluster, admin: Path, target: Path) -> Path:
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    role = yaml.safe_load((RBAC / "clusterrole.yaml").read_text())
    role["metadata"]["name"] = f"tether-operator-{cluster.namespace}"
    rbac.create_cluster_role(client.V1ClusterRole.model_validate(role))
    account = yaml.safe_load((RBAC / "serviceaccount.yaml").read_text())
    account["metadata"]["namespace"] = cluster.namespace
    cluster.core.create_namespaced_service_account(
        cluster.namespace, client.V1ServiceAccount.model_validate(account)
    )
    binding = {
        "metadata": {"name": "tether-operator"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": role["metadata"]["name"],
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": "tether-operator", "namespace": cluster.namespace}
        ],
    }
    rbac.create_namespaced_role_binding(
        cluster.namespace, client.V1RoleBinding.model_validate(binding)
    )
    request = client.AuthenticationV1TokenRequest.model_validate({"spec": {"audiences": []}})
    token = cluster.core.create_namespaced_service_account_token(
        "tether-operator", cluster.namespace, request
    )
    assert token.status is not None
    config = json.loads(admin.read_text())
    config["users"] = [{"name": "admin", "user": {"token": token.status.token}}]
    target.write_text(json.dumps(config))
    return target


def test_the_operator_needs_no_more_than_its_rbac_manifests(
    cluster: Cluster,
    restate: Restate,
    run_operator: OperatorFactory,
    kube_cluster: ControlPlane,
    tmp_path: Path,
    peering_crds: None,
) -> None:
    kubeconfig = service_account_kubeconfig(
        cluster, kube_cluster.kubeconfig, tmp_path / "operator.kubeconfig"
    )
    try:
        run_with_service_account(cluster, run_operator, kubeconfig)
    finally:
        # The operator needs its rules to finalize what a failure left, before they go.
        finalize_agents(cluster, restate)
        client.RbacAuthorizationV1Api(cluster.api).delete_cluster_role(
            f"tether-operator-{cluster.namespace}"
        )


def run_with_service_account(
    cluster: Cluster, run_operator: OperatorFactory, kubeconfig: Path
) -> None:
    with_secrets(cluster)
    cluster.create_peering(PEERING)
    operator = run_operator(KUBECONFIG=str(kubeconfig), POD_ID="rbac", TETHER_PEERING=PEERING)
    # Peering works under these rules: its keep-alive is in the object, and it leads.
    wait_for(lambda: "rbac" in cluster.peers(PEERING), timeout=30, what="its peering record")
    wait_for(
        lambda: "Resuming operations" in operator.process.log_tail(200_000),
        timeout=30,
        what="the operator to lead",
    )
    cluster.apply_agent(manifest(system="v1"))
    wait_for(lambda: registered(cluster), timeout=60, what="v1 registered")
    first = cluster.status(AGENT)["activeVersion"]
    cluster.apply_agent(manifest(system="v2"))
    wait_for(
        lambda: (
            (s := cluster.status(AGENT)).get("activeVersion") not in (None, first)
            and len(s["versions"]) == 1
        ),
        timeout=60,
        what="v2 active and v1 retired",
    )
    # kopf posts events in the background: the status may come first.
    wait_for(
        lambda: any(e["reason"] == "Retired" for e in cluster.events(AGENT)),
        timeout=30,
        what="the Retired event",
    )
    cluster.delete_agent(AGENT)
    wait_for(lambda: cluster.agent(AGENT) is None, timeout=60, what="the agent deleted")
    log = operator.process.log_tail(200_000)
    assert "Forbidden" not in log and " 403" not in log, log[-4000:]
    # It lists, watches and patches the peering object all along (keep-alives every 5-10 s).
    assert "rbac" in cluster.peers(PEERING)
