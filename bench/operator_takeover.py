"""How long the operator's standby replica takes to take over from the one that leads.

    python bench/operator_takeover.py [--kills 8] [--stops 3] [--lifetime 15]

Everything runs locally and is stopped at the end, as for `operator_registration.py`: the tier-2
control plane, a real restate-server, one stand-in worker, and two replicas of the operator
(`kopf run -m tether_operator`) that share a KopfPeering object (`TETHER_PEERING`). One agent is
Ready; then

(a) `--kills` times, the leading replica is SIGKILLed at a random moment of its keep-alive cycle
    and a new replica is started in its place. Takeover: the kill -> the heir's first supervision
    pass of the agent (its /metrics reports the agent). The floor is what peering imposes: how
    long the dead replica's record stayed fresh after the kill (at most `--lifetime`);
(b) `--stops` times, the leader is stopped cleanly (SIGTERM, as a rolling update or a node drain
    does): it removes its record, and the heir takes over without waiting.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: the repository's test harness, as `tests`

from kubernetes import client, config  # noqa: E402
from kubernetes.client import ApiClient  # noqa: E402

from tests.kube.controlplane import KubeCluster  # noqa: E402
from tests.operator.op_harness import (  # noqa: E402
    Cluster,
    OperatorProcess,
    StandinWorker,
    seconds_fresh,
    start_operator,
    wait_for,
)
from tether.programs.restate_server import RestateServer  # noqa: E402
from tether.spec.crd import durableagent_crd  # noqa: E402

PEERING = "tether-operator"
AGENT = "takeover"
POLL = 0.05


def install_crds(api: ApiClient) -> None:
    crds = client.ApiextensionsV1Api(api)
    wanted = [durableagent_crd(), *yaml.safe_load_all((REPO / "crds" / "kopfpeering.yaml").open())]
    for crd in wanted:
        crds.patch_custom_resource_definition(
            crd["metadata"]["name"],
            crd,
            field_manager="bench",
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    def established() -> bool:
        for crd in wanted:
            found = crds.read_custom_resource_definition(crd["metadata"]["name"]).to_dict()
            conditions = (found.get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    wait_for(established, timeout=30, what="the CRDs established")


def manifest() -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": [{"text": "hi"}]},
            "drain": {"delay": "0s", "timeout": "1m"},
        },
    }


def leader(bench: Cluster, replicas: dict[str, OperatorProcess]) -> str:
    """The replica whose fresh record has the highest priority: the one kopf lets act."""
    peers = bench.peers(PEERING)
    fresh = [name for name in replicas if name in peers and seconds_fresh(peers[name]) > 0]
    return max(fresh, key=lambda name: peers[name]["priority"])


def summary(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.1f} s (min {min(values):.1f}, max {max(values):.1f},"
        f" n={len(values)})"
    )


def run(kills: int, stops: int, lifetime: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tether-bench-") as scratch:
        plane_owner = KubeCluster()
        plane = plane_owner.start()
        server = RestateServer()
        worker: StandinWorker | None = None
        replicas: dict[str, OperatorProcess] = {}
        try:
            server.start()
            worker = StandinWorker()
            api: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=str(plane.kubeconfig)
            )
            install_crds(api)
            bench = Cluster(api, "takeover")
            client.CoreV1Api(api).create_namespace(
                client.V1Namespace.model_validate({"metadata": {"name": bench.namespace}})
            )
            bench.create_peering(PEERING)
            settings = {
                "TETHER_RESTATE_ADMIN_URL": server.admin_url,
                "TETHER_RESTATE_INGRESS_URL": server.ingress_url,
                "TETHER_WORKER_URL_TEMPLATE": worker.url_template,
                "TETHER_PEERING": PEERING,
                "TETHER_PEERING_LIFETIME": str(lifetime),
            }
            numbers = itertools.count()

            def start_replica() -> None:
                name = f"replica-{next(numbers)}"
                log = Path(scratch) / f"{name}.log"
                env = {**settings, "POD_ID": name}
                replicas[name] = start_operator(plane.kubeconfig, bench.namespace, env, log)
                wait_for(lambda: name in bench.peers(PEERING), timeout=30, what=f"{name} peers")

            start_replica()
            start_replica()
            bench.apply_agent(manifest())
            wait_for(lambda: bench.status(AGENT).get("phase") == "Ready", timeout=60, what="Ready")

            def hand_over(kill: bool) -> tuple[float, float]:
                dying = leader(bench, replicas)
                [heir] = [name for name in replicas if name != dying]
                fresh = max(seconds_fresh(bench.peers(PEERING)[dying]), 0.0)
                began = time.monotonic()
                if kill:
                    replicas.pop(dying).process.kill()
                else:
                    replicas.pop(dying).process.stop()
                wait_for(
                    lambda: replicas[heir].supervises(bench.namespace, AGENT),
                    timeout=lifetime + 60,
                    what=f"{heir} to take over",
                    interval=POLL,
                )
                took = time.monotonic() - began
                start_replica()
                return took, fresh

            killed: list[tuple[float, float]] = []
            for _ in range(kills):
                # A random moment of the leader's keep-alive cycle (refreshed every 5-10 s).
                time.sleep(random.uniform(0.0, lifetime))
                killed.append(hand_over(kill=True))
                print(f"  SIGKILL: {killed[-1][0]:.1f} s (record fresh {killed[-1][1]:.1f} s)")
            stopped: list[float] = []
            for _ in range(stops):
                time.sleep(random.uniform(0.0, lifetime))
                stopped.append(hand_over(kill=False)[0])
                print(f"  SIGTERM: {stopped[-1]:.1f} s")
            if killed:
                takeovers = [t for t, _ in killed]
                floors = [f for _, f in killed]
                overheads = [t - f for t, f in killed]
                print(f"(a) SIGKILL -> the standby acts: {summary(takeovers)}; lifetime {lifetime}")
                print(f"    floor (the dead record still fresh): {summary(floors)}")
                print(f"    beyond the floor (kopf's resume, the first pass): {summary(overheads)}")
            if stopped:
                print(f"(b) SIGTERM -> the standby acts: {summary(stopped)}")
            api.close()  # type: ignore[no-untyped-call]
        finally:
            for operator in replicas.values():
                operator.process.stop()
            if worker is not None:
                worker.close()
            server.close()
            plane_owner.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=8)
    parser.add_argument("--stops", type=int, default=3)
    parser.add_argument("--lifetime", type=int, default=15, help="TETHER_PEERING_LIFETIME")
    args = parser.parse_args()
    run(args.kills, args.stops, args.lifetime)


if __name__ == "__main__":
    main()
