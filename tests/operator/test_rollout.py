"""Spec changes: the new version takes new runs, the old one drains its pinned runs, then goes;
a rollback makes the earlier version active again; deletion waits for runs in flight."""

from __future__ import annotations

from typing import Any

from tests.operator.op_harness import Cluster, OperatorFactory, Restate, wait_for
from tests.operator.test_children import AGENT, manifest, registered, with_secrets
from tests.operator.test_scale_to_zero import invocation_status
from tether.spec.crd import GROUP, PLURAL, VERSION


def active(cluster: Cluster) -> str | None:
    status = cluster.status(AGENT)
    if registered(cluster) and status.get("phase") == "Ready":
        found: str | None = status.get("activeVersion")
        return found
    return None


def state_of(cluster: Cluster, digest: str) -> dict[str, Any]:
    return next((v for v in cluster.versions(AGENT) if v["hash"] == digest), {})


def roll_to(cluster: Cluster, system: str, previous: str | None) -> str:
    cluster.apply_agent(manifest(system=system))
    digest: str = wait_for(
        lambda: (a := active(cluster)) != previous and a,
        timeout=60,
        what=f"a new active version after system={system!r}",
    )
    return digest


def test_a_change_drains_the_old_version_then_retires_it(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    run_operator()
    old = roll_to(cluster, "v1", None)
    old_id = state_of(cluster, old)["restateDeploymentId"]

    # A run parks on the old version (waiting for a person): it is pinned there.
    parked_run = restate.send(AGENT, "parked", "park: approve the restart?")
    awakeable = restate.parked_awakeable(AGENT, "parked")
    wait_for(lambda: cluster.status(AGENT).get("parkedCalls") == 1, timeout=30, what="parked 1")

    new = roll_to(cluster, "v2", old)
    assert new != old
    # New runs go to the new version.
    assert restate.call(AGENT, "fresh", "hello")["version"] == new
    # The old one keeps its objects and its Restate deployment while the run is pinned to it.
    draining = wait_for(
        lambda: (v := state_of(cluster, old)).get("inFlight") == 1 and v,
        timeout=30,
        what="the old version draining with 1 run in flight",
    )
    assert draining["state"] == "Draining" and draining["restateDeploymentId"] == old_id
    condition = cluster.condition(AGENT, "Draining")
    assert condition["status"] == "True" and condition["reason"] == "WaitingForRuns"
    assert f"{old} (1 runs pinned)" in condition["message"]
    assert cluster.status(AGENT)["readyVersions"] == "2/2"
    assert f"{AGENT}-{old}" in cluster.child_names(AGENT)["deployments"]
    assert old_id in restate.deployments()
    assert restate.pinned(old_id) == 1

    # The person answers: the run finishes on the old version, which then goes away.
    restate.resolve(awakeable, "approved")
    result = restate.output(parked_run)
    assert result["version"] == old and result["answer"] == "approved"
    wait_for(
        lambda: [v["hash"] for v in cluster.versions(AGENT)] == [new],
        timeout=30,
        what="the old version to be retired",
    )
    assert old_id not in restate.deployments()
    children = cluster.child_names(AGENT)
    assert children["deployments"] == {f"{AGENT}-{new}"}
    assert children["services"] == {f"{AGENT}-{new}"}
    assert children["configmaps"] == {f"{AGENT}-{new}"}
    assert children["poddisruptionbudgets"] == {f"{AGENT}-{new}"}
    assert cluster.condition(AGENT, "Draining")["status"] == "False"
    wait_for(lambda: cluster.status(AGENT)["parkedCalls"] == 0, timeout=30, what="parked 0")
    reasons = [e["reason"] for e in cluster.events(AGENT)]
    assert {"Draining", "Retired"} <= set(reasons)


def test_a_rollback_makes_the_earlier_version_active_again(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    run_operator()
    v1 = roll_to(cluster, "v1", None)
    v1_id = state_of(cluster, v1)["restateDeploymentId"]
    parked_run = restate.send(AGENT, "parked", "park: keep v1 draining")
    awakeable = restate.parked_awakeable(AGENT, "parked")

    v2 = roll_to(cluster, "v2", v1)
    assert state_of(cluster, v1)["state"] == "Draining"
    assert restate.call(AGENT, "a", "hi")["version"] == v2

    # Back to v1 while it still drains: the same URL, registered again with force, is latest.
    back = roll_to(cluster, "v1", v2)
    assert back == v1
    assert state_of(cluster, v1)["restateDeploymentId"] == v1_id
    assert restate.call(AGENT, "b", "hi")["version"] == v1
    wait_for(
        lambda: [v["hash"] for v in cluster.versions(AGENT)] == [v1],
        timeout=30,
        what="v2 (nothing pinned) to be retired",
    )
    assert restate.deployments_of(cluster.namespace, AGENT) == {v1_id}
    restate.resolve(awakeable, "ok")
    assert restate.output(parked_run)["version"] == v1

    # And forward once more, after v2 was deleted: a fresh registration of v2's objects.
    again = roll_to(cluster, "v2", v1)
    assert again == v2
    assert restate.call(AGENT, "c", "hi")["version"] == v2
    wait_for(
        lambda: [v["hash"] for v in cluster.versions(AGENT)] == [v2],
        timeout=30,
        what="v1 to be retired",
    )
    assert len(restate.deployments_of(cluster.namespace, AGENT)) == 1


def test_deleting_waits_for_the_run_in_flight(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    run_operator()
    digest = roll_to(cluster, "v1", None)
    parked_run = restate.send(AGENT, "parked", "park: last run")
    awakeable = restate.parked_awakeable(AGENT, "parked")

    cluster.delete_agent(AGENT)
    waiting = wait_for(
        lambda: (c := cluster.condition(AGENT, "Draining")).get("reason") == "WaitingForRuns" and c,
        timeout=30,
        what="the finalizer to say it waits",
    )
    assert f"{digest}: 1" in waiting["message"]
    assert cluster.status(AGENT)["phase"] == "Deleting"
    assert any(e["reason"] == "WaitingForRuns" for e in cluster.events(AGENT))
    # Still there, still registered, still serving the pinned run.
    assert cluster.agent(AGENT) is not None
    assert restate.deployments_of(cluster.namespace, AGENT)

    restate.resolve(awakeable, "done")
    assert restate.output(parked_run)["answer"] == "done"
    wait_for(lambda: cluster.agent(AGENT) is None, timeout=30, what="the agent to be deleted")
    assert restate.deployments_of(cluster.namespace, AGENT) == set()
    assert restate.deployments_of(cluster.namespace, AGENT, sidecar=True) == set()
    for sidecar in (False, True):
        assert cluster.child_names(AGENT, sidecar=sidecar) == {
            "deployments": set(),
            "services": set(),
            "configmaps": set(),
            "poddisruptionbudgets": set(),
        }


def test_deleting_waits_for_the_runs_of_a_version_the_status_lost(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    """Its Restate id written nowhere (a status write that failed after its registration, then
    a crash): the finalizer finds the version by its metadata, waits and unregisters it."""
    with_secrets(cluster)
    operator = run_operator()
    digest = roll_to(cluster, "v1", None)
    parked_run = restate.send(AGENT, "parked", "park: last run")
    awakeable = restate.parked_awakeable(AGENT, "parked")
    operator.process.kill()
    lost = [
        {k: v for k, v in version.items() if k != "restateDeploymentId"}
        for version in cluster.versions(AGENT)
    ]
    cluster.objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, cluster.namespace, PLURAL, AGENT, {"status": {"versions": lost}}
    )
    assert all("restateDeploymentId" not in v for v in cluster.versions(AGENT))

    cluster.delete_agent(AGENT)
    run_operator()
    waiting = wait_for(
        lambda: (c := cluster.condition(AGENT, "Draining")).get("reason") == "WaitingForRuns" and c,
        timeout=30,
        what="the finalizer to say it waits",
    )
    assert f"{digest}: 1" in waiting["message"]
    restate.resolve(awakeable, "done")
    assert restate.output(parked_run)["answer"] == "done"
    wait_for(lambda: cluster.agent(AGENT) is None, timeout=30, what="the agent to be deleted")
    assert restate.deployments_of(cluster.namespace, AGENT) == set()


def test_deleting_past_drain_timeout_ends_the_runs_it_cuts_off(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    """The run in flight and the one queued behind it in its session: cancelled, none left to
    hold the session for an agent made again under the name."""
    with_secrets(cluster)
    run_operator()
    cluster.apply_agent(manifest(system="v1", drain={"delay": "0s", "timeout": "3s"}))
    wait_for(lambda: active(cluster), timeout=60, what="v1 active")
    stuck = restate.send(AGENT, "stuck", "park: nobody answers")
    restate.parked_awakeable(AGENT, "stuck")
    queued = restate.send(AGENT, "stuck", "hello")

    cluster.delete_agent(AGENT)
    wait_for(lambda: cluster.agent(AGENT) is None, timeout=60, what="the agent to be deleted")
    for invocation in (stuck, queued):
        assert invocation_status(restate, invocation) in ("completed", ""), invocation
    warnings = [e for e in cluster.events(AGENT) if e["type"] == "Warning"]
    assert any(
        e["reason"] == "DrainTimeout" and "2 runs in flight; 1 pinned: cancelling" in e["message"]
        for e in warnings
    ), warnings
    assert restate.deployments_of(cluster.namespace, AGENT) == set()


def test_drain_timeout_bounds_the_wait(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    with_secrets(cluster)
    run_operator()
    cluster.apply_agent(manifest(system="v1", drain={"delay": "0s", "timeout": "3s"}))
    old = wait_for(lambda: active(cluster), timeout=60, what="v1 active")
    stuck = restate.send(AGENT, "stuck", "park: nobody answers")
    restate.parked_awakeable(AGENT, "stuck")
    cluster.apply_agent(manifest(system="v2", drain={"delay": "0s", "timeout": "3s"}))
    wait_for(
        lambda: old not in {v["hash"] for v in cluster.versions(AGENT)} and active(cluster),
        timeout=30,
        what="the old version removed after drain.timeout",
    )
    warnings = [e for e in cluster.events(AGENT) if e["type"] == "Warning"]
    assert any(
        e["reason"] == "DrainTimeout" and "1 runs pinned: cancelling them" in e["message"]
        for e in warnings
    )
    # Cancelled, not left pinned to a deployment Restate no longer has: it would hold its
    # session's lock for good, and the session's next run would wait behind it forever.
    assert invocation_status(restate, stuck) in ("completed", "")  # "": completed and gone
    assert restate.call(AGENT, "stuck", "hello", timeout=30)["version"] != old
