"""How fast the operator turns a DurableAgent into a registered Restate deployment.

    python bench/operator_registration.py [--repeat 10] [--fleet 50] [--interval 1.0]

Everything runs locally and is stopped at the end: the tier-2 control plane (etcd,
kube-apiserver, controller-manager, scheduler, kwok), a real restate-server, one stand-in worker
process serving every agent (tests/operator/standin_worker.py) and the operator as a real
process (`kopf run -m tether_operator`).

(a) apply -> Registered=True for one agent at a time, median of `--repeat` (goal: < 3 s);
(b) `--fleet` agents applied at once -> all Ready (goal: < 60 s).

The floor of (a) is what the operator cannot beat: a bare Deployment applied until kwok makes
it available, measured the same way in the same run; the ratio is printed next to it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: the repository's test harness, as `tests`

from kubernetes import client, config  # noqa: E402
from kubernetes.client import ApiClient  # noqa: E402

from tests.kube.controlplane import KubeCluster  # noqa: E402
from tests.operator.op_harness import Cluster, StandinWorker, start_operator, wait_for  # noqa: E402
from tether.programs.restate_server import RestateServer  # noqa: E402
from tether.spec.crd import CRD_NAME, durableagent_crd  # noqa: E402

POLL = 0.02


def manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": name},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": [{"text": "hi"}]},
            "drain": {"delay": "0s", "timeout": "1m"},
        },
    }


def timed(start: Callable[[], None], done: Callable[[], bool], timeout: float, what: str) -> float:
    began = time.perf_counter()
    start()
    wait_for(done, timeout=timeout, what=what, interval=POLL)
    return time.perf_counter() - began


def install_crd(api: ApiClient) -> None:
    crds = client.ApiextensionsV1Api(api)
    crds.patch_custom_resource_definition(
        CRD_NAME,
        durableagent_crd(),
        field_manager="bench",
        force=True,
        _content_type="application/apply-patch+yaml",
    )

    def established() -> bool:
        status = crds.read_custom_resource_definition(CRD_NAME).to_dict().get("status") or {}
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in status.get("conditions") or []
        )

    wait_for(established, timeout=30, what="CRD established")


def namespace(api: ApiClient, prefix: str) -> Cluster:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace.model_validate({"metadata": {"name": name}})
    )
    return Cluster(api, name)


def deployment_floor(cluster: Cluster, index: int) -> float:
    name = f"floor-{index}"
    labels = {"app": name}
    body = client.V1Deployment.model_validate(
        {
            "metadata": {"name": name},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "c", "image": "example/none"}]},
                },
            },
        }
    )

    def available() -> bool:
        status = cluster.apps.read_namespaced_deployment_status(name, cluster.namespace).status
        return bool(status and (status.available_replicas or 0) >= 1)

    return timed(
        lambda: cluster.apps.create_namespaced_deployment(cluster.namespace, body),
        available,
        60,
        f"deployment {name} available",
    )


def registered(cluster: Cluster, name: str) -> bool:
    return cluster.condition(name, "Registered").get("status") == "True"


def ready(cluster: Cluster, name: str) -> bool:
    return cluster.status(name).get("phase") == "Ready"


def run(repeat: int, fleet: int, interval: float) -> None:
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as scratch:
        plane_owner = KubeCluster()
        plane = plane_owner.start()
        server = RestateServer()
        worker: StandinWorker | None = None
        operator = None
        try:
            server.start()
            worker = StandinWorker()
            api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(plane.kubeconfig)
            )
            install_crd(api)
            bench = namespace(api, "bench")
            operator = start_operator(
                plane.kubeconfig,
                bench.namespace,
                {
                    "TETHER_RESTATE_ADMIN_URL": server.admin_url,
                    "TETHER_RESTATE_INGRESS_URL": server.ingress_url,
                    "TETHER_WORKER_URL_TEMPLATE": worker.url_template,
                    "TETHER_RECONCILE_INTERVAL": str(interval),
                },
                Path(scratch) / "operator.log",
            )
            floors = [deployment_floor(bench, i) for i in range(repeat)]
            singles = []
            for i in range(repeat):
                name = f"single-{i}"
                singles.append(
                    timed(
                        lambda name=name: bench.apply_agent(manifest(name)),  # type: ignore[misc]
                        lambda name=name: registered(bench, name),  # type: ignore[misc]
                        60,
                        f"{name} Registered",
                    )
                )
            floor, single = statistics.median(floors), statistics.median(singles)
            print(f"(a) apply -> Registered, median of {repeat}: {single:.2f} s (goal < 3 s)")
            ratio = single / floor
            print(f"    floor (bare Deployment -> available): {floor:.2f} s; ratio {ratio:.2f}")
            print(f"    all: {', '.join(f'{s:.2f}' for s in singles)}")

            names = [f"fleet-{i}" for i in range(fleet)]

            def apply_all() -> None:
                with ThreadPoolExecutor(max_workers=8) as pool:
                    list(pool.map(lambda n: bench.apply_agent(manifest(n)), names))

            def all_ready() -> bool:
                listed: Any = bench.objects.list_namespaced_custom_object(
                    "tether.dev", "v1alpha1", bench.namespace, "durableagents"
                )
                phases = {
                    item["metadata"]["name"]: (item.get("status") or {}).get("phase")
                    for item in listed["items"]
                }
                return all(phases.get(n) == "Ready" for n in names)

            total = timed(apply_all, all_ready, 300, f"{fleet} agents Ready")
            print(f"(b) {fleet} agents applied at once -> all Ready: {total:.1f} s (goal < 60 s)")
            api.close()  # type: ignore[no-untyped-call]
        finally:
            if operator is not None:
                operator.process.stop()
            if worker is not None:
                worker.close()
            server.close()
            plane_owner.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--fleet", type=int, default=50)
    parser.add_argument("--interval", type=float, default=1.0, help="TETHER_RECONCILE_INTERVAL")
    args = parser.parse_args()
    run(args.repeat, args.fleet, args.interval)


if __name__ == "__main__":
    main()
