"""Fixtures of the operator tests: the tier-2 control plane (Deployments get Ready pods through
kwok), the CRD, one real restate-server and one stand-in worker for the session, a namespace and
an operator process per test.

A package of `tests` (`tests.operator`), so it shadows nothing of the standard library.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client import ApiClient

from tests.kube.conftest import kube_cluster  # noqa: F401  (the shared tier-2 control plane)
from tests.kube.controlplane import ControlPlane
from tests.operator.op_harness import (
    REPO,
    Cluster,
    OperatorFactory,
    OperatorProcess,
    Restate,
    StandinWorker,
    finalize_agents,
    start_operator,
    wait_for,
)
from tether.programs.restate_install import find_or_install_restate_server
from tether.programs.restate_server import RestateServer
from tether.spec.crd import CRD_NAME, durableagent_crd

#: Retries of a failed attempt at most 2 s apart, so a worker that starts late is picked up soon.
RESTATE_ENV = {"RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL": "2s"}


@pytest.fixture(scope="session")
def kube_api(kube_cluster: ControlPlane) -> Iterator[ApiClient]:  # noqa: F811
    api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube_cluster.kubeconfig)
    )
    crds = client.ApiextensionsV1Api(api)
    crds.patch_custom_resource_definition(
        CRD_NAME,
        durableagent_crd(),
        field_manager="tether-tests",
        force=True,
        _content_type="application/apply-patch+yaml",
    )

    def established() -> bool:
        status = crds.read_custom_resource_definition(CRD_NAME).to_dict().get("status") or {}
        conditions = status.get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_for(established, timeout=30, what="the DurableAgent CRD to be Established")
    yield api
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def peering_crds(kube_api: ApiClient) -> None:
    """kopf's KopfPeering and ClusterKopfPeering CRDs (crds/kopfpeering.yaml), Established."""
    crds = client.ApiextensionsV1Api(kube_api)
    names = []
    for crd in yaml.safe_load_all((REPO / "crds" / "kopfpeering.yaml").read_text()):
        crds.patch_custom_resource_definition(
            crd["metadata"]["name"],
            crd,
            field_manager="tether-tests",
            force=True,
            _content_type="application/apply-patch+yaml",
        )
        names.append(crd["metadata"]["name"])

    def established() -> bool:
        for name in names:
            status = crds.read_custom_resource_definition(name).to_dict().get("status") or {}
            conditions = status.get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for(established, timeout=30, what="kopf's peering CRDs to be Established")


@pytest.fixture(scope="session")
def restate() -> Iterator[Restate]:
    with RestateServer(find_or_install_restate_server(), extra_env=RESTATE_ENV) as server:
        yield Restate(server)


@pytest.fixture(scope="session")
def standin() -> Iterator[StandinWorker]:
    worker = StandinWorker()
    yield worker
    worker.close()


@pytest.fixture
def cluster(kube_api: ApiClient) -> Cluster:
    namespace = f"op-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(kube_api).create_namespace(
        client.V1Namespace.model_validate({"metadata": {"name": namespace}})
    )
    return Cluster(kube_api, namespace)


@pytest.fixture
def run_operator(
    kube_cluster: ControlPlane,  # noqa: F811
    cluster: Cluster,
    restate: Restate,
    standin: StandinWorker,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> Iterator[OperatorFactory]:
    """Start the operator for the test's namespace (call again after a kill: same log file,
    unless `log` names another, e.g. one per replica).

    At the end every DurableAgent of the namespace is deleted while an operator still runs, so
    the finalizers complete, then the operator stops and the namespace goes.
    """
    started: list[OperatorProcess] = []
    logs: dict[str, Path] = {}

    def start(entry: str = "kopf", log: str = "operator.log", **env: str) -> OperatorProcess:
        settings = {
            "TETHER_RESTATE_ADMIN_URL": restate.server.admin_url,
            "TETHER_RESTATE_INGRESS_URL": restate.server.ingress_url,
            "TETHER_WORKER_URL_TEMPLATE": standin.url_template,
            "TETHER_RECONCILE_INTERVAL": "0.5",
            "TETHER_PARKED_REFRESH": "1",
            **env,
        }
        logs[log] = tmp_path / log
        operator = start_operator(
            kube_cluster.kubeconfig, cluster.namespace, settings, logs[log], entry=entry
        )
        started.append(operator)
        return operator

    yield start
    try:
        if any(o.process.alive() for o in started):
            finalize_agents(cluster, restate)
    finally:
        for operator in started:
            operator.process.stop()
        failed = getattr(request.node, "rep_call", None)
        if (failed is not None and failed.failed) or os.environ.get("TETHER_SHOW_OPERATOR_LOG"):
            for name, path in logs.items():
                sys.stderr.write(
                    f"\n----- {name} -----\n{path.read_text(errors='replace')[-20000:]}\n"
                )
        restate.forget_namespace(cluster.namespace)
        client.CoreV1Api(cluster.api).delete_namespace(cluster.namespace)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    setattr(item, f"rep_{report.when}", report)  # type: ignore[attr-defined]
    return report  # type: ignore[return-value]
