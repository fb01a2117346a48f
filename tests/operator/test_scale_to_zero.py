"""Scale to zero: a draining version whose only run is parked on a person goes to zero replicas
after `spec.scaling.idleAfter` and stays registered; the answer wakes it, the run finishes on
it, and it drains and is retired as before. The active version goes to zero when idle too, and
a new run wakes it.

Real components: the operator process, kube-apiserver with the controller-manager and kwok (the
Deployment's pods come and go), a restate-server, and the stand-in worker behind a loopback
kube-proxy (`local_proxy.py`) that routes to a version only while its Deployment has a ready
replica, so Restate meets a refused connection at zero replicas, as at a Service without
endpoints.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.kube.controlplane import ControlPlane
from tests.operator import local_proxy
from tests.operator.local_proxy import LocalProxy
from tests.operator.op_harness import (
    Cluster,
    OperatorFactory,
    Restate,
    StandinWorker,
    dumped_on_failure,
    operator_gauges,
    wait_for,
)
from tests.operator.test_children import AGENT, manifest, registered, with_secrets
from tests.operator.test_rbac import service_account_kubeconfig
from tether.programs.restate_install import find_or_install_restate_server
from tether.programs.restate_server import RestateServer

IDLE_AFTER = "2s"
RESTATE_ENV = {
    # A run parked on an awakeable suspends after a second (default: a minute).
    "RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT": "1s",
    # Retries at most a second apart, as tether's worker registers for the agent's services
    # (`tether.programs.worker.retries`), with fewer attempts, so that a run nobody wakes pauses
    # within seconds.
    "RESTATE_DEFAULT_RETRY_POLICY__INITIAL_INTERVAL": "100ms",
    "RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL": "1s",
    "RESTATE_DEFAULT_RETRY_POLICY__MAX_ATTEMPTS": "10",
}


@pytest.fixture(scope="module")
def restate() -> Iterator[Restate]:
    """This module's own restate-server (the retry policy and suspension above)."""
    with RestateServer(find_or_install_restate_server(), extra_env=RESTATE_ENV) as server:
        yield Restate(server)


@pytest.fixture
def proxy(cluster: Cluster, standin: StandinWorker) -> Iterator[LocalProxy]:
    helper = LocalProxy(cluster, standin.port)
    yield helper
    helper.close()


@pytest.fixture
def least_privilege(cluster: Cluster, kube_cluster: ControlPlane, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of a service account bound to exactly operator/rbac/'s rules."""
    kubeconfig = service_account_kubeconfig(
        cluster, kube_cluster.kubeconfig, tmp_path / "operator.kubeconfig"
    )
    yield kubeconfig
    rbac = client.RbacAuthorizationV1Api(cluster.api)
    rbac.delete_cluster_role(f"tether-operator-{cluster.namespace}")


def agent(system: str) -> dict[str, Any]:
    return manifest(system=system, scaling={"idleAfter": IDLE_AFTER})


def roll(cluster: Cluster, system: str, previous: str | None) -> str:
    cluster.apply_agent(agent(system))

    def rolled() -> str | None:
        status = cluster.status(AGENT)
        digest: str | None = status.get("activeVersion")
        ready = registered(cluster) and status.get("phase") == "Ready"
        return digest if ready and digest != previous else None

    found: str = wait_for(rolled, timeout=60, what=f"a new active version after {system!r}")
    return found


def apply_and_wait(cluster: Cluster, changed: dict[str, Any], marker: str) -> None:
    """Apply the agent and wait until the operator handled it (kopf's record of the last
    handled spec has `marker`)."""
    cluster.apply_agent(changed)
    wait_for(
        lambda: (
            marker
            in (cluster.agent(AGENT) or {})["metadata"]["annotations"].get(
                "tether.dev/last-handled-configuration", ""
            )
        ),
        timeout=30,
        what="the change handled",
    )


def version(cluster: Cluster, digest: str) -> dict[str, Any]:
    return next((v for v in cluster.versions(AGENT) if v["hash"] == digest), {})


def deployment(cluster: Cluster, digest: str) -> Any:
    return cluster.apps.read_namespaced_deployment(f"{AGENT}-{digest}", cluster.namespace)


def replicas(cluster: Cluster, digest: str) -> int:
    return int(deployment(cluster, digest).spec.replicas)


def ready_replicas(cluster: Cluster, digest: str) -> int:
    return int(deployment(cluster, digest).status.ready_replicas or 0)


def event(cluster: Cluster, reason: str) -> dict[str, Any]:
    """The first event of the agent with `reason` (kopf posts them in the background)."""
    found: dict[str, Any] = wait_for(
        lambda: next((e for e in cluster.events(AGENT) if e["reason"] == reason), None),
        timeout=10,
        what=f"a {reason} event",
    )
    return found


def invocation_status(restate: Restate, invocation: str) -> str:
    rows = restate.server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation}'")
    return str(rows[0]["status"]) if rows else ""


def completed_at(restate: Restate, invocation: str) -> float:
    rows = restate.server.query(
        f"SELECT completed_at FROM sys_invocation WHERE id = '{invocation}'"
    )
    stamp = str(rows[0]["completed_at"]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp).timestamp()


def gauges(url: str, namespace: str, digest: str) -> dict[str, float]:
    """The operator's `tether_version_*` gauges of one version, by name."""
    return operator_gauges(url, "tether_version_", namespace=namespace, agent=AGENT, version=digest)


def parked_version_at_zero(
    cluster: Cluster,
    restate: Restate,
    run_operator: OperatorFactory,
    proxy: LocalProxy,
    **env: str,
) -> tuple[Any, str, str, str, str]:
    """v1 with a run parked on an awakeable, then v2: v1 drains, and goes to zero replicas, its
    pod goes and its port closes. (operator, v1, v2, the parked run's invocation, its
    awakeable)."""
    with_secrets(cluster)
    operator = run_operator(**local_proxy.url_template(), **env)
    old = roll(cluster, "v1", None)
    parked_run = restate.send(AGENT, "parked", "park: approve the restart?")
    awakeable = restate.parked_awakeable(AGENT, "parked")
    wait_for(
        lambda: invocation_status(restate, parked_run) == "suspended",
        timeout=30,
        what="the parked run to suspend",
    )
    new = roll(cluster, "v2", old)
    assert restate.call(AGENT, "fresh", "hello")["version"] == new
    wait_for(lambda: replicas(cluster, old) == 0, timeout=30, what="v1 scaled to zero replicas")
    wait_for(lambda: ready_replicas(cluster, old) == 0, timeout=30, what="v1's pod gone")
    wait_for(lambda: not proxy.is_open(f"{AGENT}-{old}"), timeout=10, what="v1's port closed")
    return operator, old, new, parked_run, awakeable


def test_a_parked_version_scales_to_zero_and_the_answer_wakes_it(
    cluster: Cluster,
    restate: Restate,
    least_privilege: Path,  # before run_operator: its rules outlive the operator's clean-up
    run_operator: OperatorFactory,
    proxy: LocalProxy,
) -> None:
    # The operator runs with its RBAC manifests' rules only: scaling needs no more of them.
    operator, old, new, parked_run, awakeable = parked_version_at_zero(
        cluster, restate, run_operator, proxy, KUBECONFIG=str(least_privilege)
    )
    old_id = version(cluster, old)["restateDeploymentId"]
    # At zero (its pod gone, its port closed): said in the status, the events, the Draining
    # condition and the gauges, and the version stays registered with Restate.
    asleep = wait_for(
        lambda: (v := version(cluster, old)).get("replicas") == 0 and v,
        timeout=30,
        what="the status to say v1 wants 0 replicas",
    )
    assert asleep["state"] == "Draining" and asleep["scaledToZeroAt"]
    assert asleep["parkedRuns"] == 1 and asleep["activeRuns"] == 0 and asleep["inFlight"] == 1
    assert "parked runs wait in Restate" in event(cluster, "ScaledToZero")["message"]
    assert old_id in restate.deployments() and restate.pinned(old_id) == 1
    assert "at zero replicas" in cluster.condition(AGENT, "Draining")["message"]

    def at_zero() -> dict[str, float] | None:
        found = gauges(operator.metrics, cluster.namespace, old)
        return found if found.get("tether_version_replicas") == 0 else None

    values = wait_for(at_zero, timeout=10, what="the gauges of v1 at zero")
    assert values["tether_version_parked_runs"] == 1
    assert values["tether_version_active_runs"] == 0
    # The scaler owns spec.replicas of the Deployment at zero, and says from how many.
    scaled = deployment(cluster, old)
    owners = {m.manager for m in scaled.metadata.managed_fields or []}
    assert "tether-operator-scale" in owners
    assert scaled.metadata.annotations["tether.dev/replicas"] == "1"
    # The active version, idle too, goes to zero as well (the agent's sidecar, a Deployment of
    # its own, takes the webhooks); it still takes new runs.
    wait_for(lambda: replicas(cluster, new) == 0, timeout=30, what="v2 scaled to zero replicas")
    assert cluster.condition(AGENT, "Ready")["status"] == "True"

    # The person answers: Restate cannot reach v1 and backs off; the operator sees the run
    # active and scales v1 back up; Restate's next attempt reaches the new pod.
    with dumped_on_failure(lambda: str(cluster.events(AGENT))):
        resolved_wall, resolved = time.time(), time.monotonic()
        restate.resolve(awakeable, "approved")
        wait_for(lambda: replicas(cluster, old) == 1, timeout=10, what="v1 scaled back up")
        scaled_up = time.monotonic() - resolved
        wait_for(lambda: ready_replicas(cluster, old) == 1, timeout=10, what="v1's pod ready")
        pod_ready = time.monotonic() - resolved
        result = restate.output(parked_run, timeout=30)
        assert result["version"] == old and result["answer"] == "approved"
        next_step = completed_at(restate, parked_run) - resolved_wall
    print(
        f"\nwake-up: scaled up {scaled_up:.2f}s, pod ready {pod_ready:.2f}s, the run's next "
        f"journaled step (its completion) {next_step:.2f}s after the answer"
    )
    assert next_step < 10
    assert "1 runs need it (1 active, 0 paused)" in event(cluster, "WokeUp")["message"]

    # Nothing pinned any more: v1 drains and is retired as before.
    wait_for(
        lambda: [v["hash"] for v in cluster.versions(AGENT)] == [new],
        timeout=30,
        what="v1 retired",
    )
    assert old_id not in restate.deployments()
    assert cluster.child_names(AGENT)["deployments"] == {f"{AGENT}-{new}"}
    assert f"version {old} unregistered and deleted" in event(cluster, "Retired")["message"]
    wait_for(
        lambda: not gauges(operator.metrics, cluster.namespace, old),
        timeout=10,
        what="v1's gauges gone",
    )
    # Waking v1 left v2 asleep: its runs did not need it.
    assert replicas(cluster, new) == 0
    assert gauges(operator.metrics, cluster.namespace, new)["tether_version_replicas"] == 0
    log = operator.process.log_tail(200_000)
    assert "Forbidden" not in log and " 403" not in log, log[-4000:]


def test_the_active_version_scales_to_zero_and_a_new_run_wakes_it(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, proxy: LocalProxy
) -> None:
    with_secrets(cluster)
    run_operator(**local_proxy.url_template())
    active = roll(cluster, "v1", None)
    assert restate.call(AGENT, "first", "hello")["version"] == active
    wait_for(lambda: replicas(cluster, active) == 0, timeout=30, what="v1 scaled to zero")
    wait_for(lambda: not proxy.is_open(f"{AGENT}-{active}"), timeout=10, what="v1's port closed")
    ready = wait_for(
        lambda: (
            (c := cluster.condition(AGENT, "Ready")).get("status") == "True"
            and "at zero replicas" in c.get("message", "")
            and c
        ),
        timeout=10,
        what="Ready to say v1 is at zero and takes new runs",
    )
    assert f"version {active} takes new runs" in ready["message"]
    assert cluster.status(AGENT)["phase"] == "Ready"
    # A change that is not a new version applies the version's objects again (as an operator
    # restart does): that apply leaves spec.replicas to the scaler while it is at zero.
    changed = agent("v1")
    changed["spec"]["drain"]["timeout"] = "11m"
    apply_and_wait(cluster, changed, '"11m"')
    assert cluster.status(AGENT)["activeVersion"] == active and replicas(cluster, active) == 0

    # A new run: Restate cannot reach v1 and backs off, unpinned; the operator counts it for
    # the active version and wakes it.
    with dumped_on_failure(lambda: str(cluster.events(AGENT))):
        sent = time.monotonic()
        result = restate.call(AGENT, "second", "hello again", timeout=30)
        answered = time.monotonic() - sent
    assert result["version"] == active
    print(
        f"\nwake-up of the active version: the new run answered {answered:.2f}s after it was sent"
    )
    assert answered < 10
    assert "1 runs need it (1 active, 0 paused)" in event(cluster, "WokeUp")["message"]


def test_runs_paused_while_the_operator_was_down_are_resumed(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, proxy: LocalProxy
) -> None:
    operator, old, new, parked_run, awakeable = parked_version_at_zero(
        cluster, restate, run_operator, proxy
    )
    wait_for(lambda: version(cluster, old).get("replicas") == 0, timeout=30, what="status 0")
    operator.process.kill()
    # The answer comes while nobody watches: Restate's retries run out and the run pauses.
    restate.resolve(awakeable, "approved")
    wait_for(
        lambda: invocation_status(restate, parked_run) == "paused",
        timeout=60,
        what="the run to pause",
    )
    assert replicas(cluster, old) == 0
    run_operator(**local_proxy.url_template())
    result = restate.output(parked_run, timeout=60)
    assert result["version"] == old and result["answer"] == "approved"
    assert "(0 active, 1 paused)" in event(cluster, "WokeUp")["message"]
    assert f"1 paused runs of version {old} resumed" in event(cluster, "Resumed")["message"]
    wait_for(
        lambda: [v["hash"] for v in cluster.versions(AGENT)] == [new],
        timeout=30,
        what="v1 retired",
    )


def test_deleting_the_agent_wakes_a_version_whose_run_has_work(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, proxy: LocalProxy
) -> None:
    _, old, _, parked_run, awakeable = parked_version_at_zero(cluster, restate, run_operator, proxy)
    cluster.delete_agent(AGENT)
    wait_for(
        lambda: cluster.condition(AGENT, "Draining").get("reason") == "WaitingForRuns",
        timeout=30,
        what="the finalizer to wait for the parked run",
    )
    assert replicas(cluster, old) == 0
    # The finalizer waits for the run; the supervision pass no longer runs, the finalizer wakes
    # the version itself.
    restate.resolve(awakeable, "approved")
    result = restate.output(parked_run, timeout=30)
    assert result["version"] == old and result["answer"] == "approved"
    wait_for(lambda: cluster.agent(AGENT) is None, timeout=30, what="the agent deleted")
    assert restate.deployments_of(cluster.namespace, AGENT) == set()
    assert restate.deployments_of(cluster.namespace, AGENT, sidecar=True) == set()
    assert "(1 active, 0 paused)" in event(cluster, "WokeUp")["message"]
