"""Autoscaling (`spec.scaling.activeRunsPerReplica`): the operator gives a version as many pods
as its active runs need, at once, and takes them away once fewer were needed for
`scaleDownAfter`; applying the agent again leaves the scaler's replicas alone.

Real components, as in test_scale_to_zero.py: the operator process, kube-apiserver with the
controller-manager and kwok, a restate-server and the stand-in worker behind the loopback
kube-proxy. The runs are the stand-in's `busy:<seconds>` runs, running in Restate that long.
"""

from __future__ import annotations

import time
from typing import Any

from tests.operator import local_proxy
from tests.operator.local_proxy import LocalProxy
from tests.operator.op_harness import Cluster, OperatorFactory, Restate, wait_for
from tests.operator.test_children import AGENT, manifest, registered, with_secrets
from tests.operator.test_scale_to_zero import (
    apply_and_wait,
    deployment,
    event,
    invocation_status,
    proxy,
    replicas,
)

__all__ = ["proxy"]  # the fixture

SCALE_DOWN_AFTER = "4s"


def autoscaled(scale_down_after: str = SCALE_DOWN_AFTER) -> dict[str, Any]:
    scaling = {
        "activeRunsPerReplica": 2,
        "minReplicas": 1,
        "maxReplicas": 3,
        "scaleDownAfter": scale_down_after,
    }
    return manifest(system="v1", scaling=scaling)


def test_a_version_gets_the_pods_its_active_runs_need_and_gives_them_back(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, proxy: LocalProxy
) -> None:
    with_secrets(cluster)
    run_operator(**local_proxy.url_template())
    cluster.apply_agent(autoscaled())
    active: str = wait_for(
        lambda: registered(cluster) and cluster.status(AGENT).get("activeVersion"),
        timeout=60,
        what="v1 active",
    )
    assert replicas(cluster, active) == 1

    # Six runs at 2 per replica need 3 pods.
    runs = [restate.send(AGENT, f"s{i}", "busy:12") for i in range(6)]
    sent = time.monotonic()
    wait_for(lambda: replicas(cluster, active) == 3, timeout=30, what="v1 scaled to 3 replicas")
    print(f"\nscaled up {time.monotonic() - sent:.1f}s after 6 runs started")
    assert "6 active runs, 2 per replica" in event(cluster, "ScaledUp")["message"]
    generation = deployment(cluster, active).metadata.generation

    # A change that is not a new version applies the version's objects again: the apply keeps
    # the scaler's replicas instead of setting worker.replicas (1), which the scaler would then
    # undo (the Deployment's generation counts both).
    apply_and_wait(cluster, autoscaled(scale_down_after="5s"), '"5s"')
    assert cluster.status(AGENT)["activeVersion"] == active
    assert deployment(cluster, active).metadata.generation == generation
    assert replicas(cluster, active) == 3

    # While the runs go on it keeps them; once they ended, it goes back to minReplicas, but
    # only after scaleDownAfter.
    wait_for(
        lambda: all(invocation_status(restate, run) == "completed" for run in runs),
        timeout=60,
        what="the busy runs to complete",
    )
    ended = time.monotonic()
    assert replicas(cluster, active) == 3
    wait_for(lambda: replicas(cluster, active) == 1, timeout=40, what="v1 back to 1 replica")
    waited = time.monotonic() - ended
    print(f"scaled down {waited:.1f}s after the runs ended")
    assert (
        "for at least 5s (spec.scaling.scaleDownAfter)" in event(cluster, "ScaledDown")["message"]
    )
    assert waited >= 5 - 1  # the window, less the last pass's lag behind the runs' end
    assert restate.call(AGENT, "after", "hello")["version"] == active


def test_replicas_another_scaler_set_survive_applying_the_agent_again(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, proxy: LocalProxy
) -> None:
    """An HPA, KEDA or `kubectl scale` sets replicas through the scale subresource: the
    operator's apply of the version keeps them (it applied worker.replicas, 1, forced)."""
    with_secrets(cluster)
    run_operator(**local_proxy.url_template())
    cluster.apply_agent(manifest(system="v1"))
    active: str = wait_for(
        lambda: registered(cluster) and cluster.status(AGENT).get("activeVersion"),
        timeout=60,
        what="v1 active",
    )
    name = f"{AGENT}-{active}"
    cluster.apps.patch_namespaced_deployment_scale(
        name, cluster.namespace, {"spec": {"replicas": 3}}, field_manager="hpa-standin"
    )
    generation = deployment(cluster, active).metadata.generation
    changed = manifest(system="v1")
    changed["spec"]["drain"]["timeout"] = "11m"
    apply_and_wait(cluster, changed, '"11m"')
    assert cluster.status(AGENT)["activeVersion"] == active
    assert deployment(cluster, active).metadata.generation == generation
    assert replicas(cluster, active) == 3
