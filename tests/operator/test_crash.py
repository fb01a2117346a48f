"""The operator SIGKILLed at random points of a rollout, ten times: it converges, and no Restate
deployment or Kubernetes object is left behind."""

from __future__ import annotations

import os
import random
import time

from tests.operator.op_harness import Cluster, OperatorFactory, Restate, wait_for
from tests.operator.test_children import AGENT, manifest, registered, with_secrets

KILLS = 10


def test_killed_operator_converges_without_orphans(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    seed = int(os.environ.get("TETHER_CRASH_SEED") or time.time())
    print(f"TETHER_CRASH_SEED={seed}")
    chance = random.Random(seed)
    with_secrets(cluster)
    operator = run_operator()
    cluster.apply_agent(manifest(system="v0"))
    wait_for(lambda: registered(cluster), timeout=60, what="v0 registered")
    first = cluster.status(AGENT)["activeVersion"]
    # A run parked on the first version keeps it draining through all the kills.
    parked_run = restate.send(AGENT, "parked", "park: hold v0")
    awakeable = restate.parked_awakeable(AGENT, "parked")

    for kill in range(1, KILLS + 1):
        cluster.apply_agent(manifest(system=f"v{kill}"))
        # The random point of the rollout at which the operator dies (not a synchronisation).
        time.sleep(chance.uniform(0.0, 2.5))
        operator.process.kill()
        operator = run_operator()

    final = wait_for(
        lambda: (
            (s := cluster.status(AGENT)).get("phase") == "Ready"
            and s.get("observedGeneration")
            == (cluster.agent(AGENT) or {})["metadata"]["generation"]
            and {v["hash"] for v in s["versions"]} == {s["activeVersion"], first}
            and s["activeVersion"]
        ),
        timeout=120,
        what="the last spec active, only v0 draining",
    )
    assert final != first
    assert restate.call(AGENT, "after", "hello")["version"] == final

    restate.resolve(awakeable, "go")
    assert restate.output(parked_run)["version"] == first
    wait_for(
        lambda: [v["hash"] for v in cluster.versions(AGENT)] == [final],
        timeout=60,
        what="v0 retired",
    )
    [version] = cluster.versions(AGENT)
    # No orphans: one Restate deployment per version and the sidecar, the objects of one version
    # plus the sidecar's.
    owned = restate.deployments_of(cluster.namespace, AGENT)
    wait_for(
        lambda: (
            restate.deployments_of(cluster.namespace, AGENT) == {version["restateDeploymentId"]}
        ),
        timeout=30,
        what=f"only the final Restate deployment (have {owned})",
    )
    name = f"{AGENT}-{final}"
    assert cluster.child_names(AGENT) == {
        "deployments": {name},
        "services": {name},
        "configmaps": {name},
        "poddisruptionbudgets": {name},
    }
    sidecar = f"{AGENT}-sidecar"
    assert cluster.child_names(AGENT, sidecar=True) == {
        "deployments": {sidecar},
        "services": {sidecar},
        "configmaps": {sidecar},
        "poddisruptionbudgets": {sidecar},
    }
    sidecar_id = cluster.status(AGENT)["sidecar"]["restateDeploymentId"]
    prefix = f"/{cluster.namespace}/{AGENT}/"
    stray = [d for d in restate.deployments().values() if prefix in d["uri"]]
    assert {d["id"] for d in stray} == {version["restateDeploymentId"], sidecar_id}
