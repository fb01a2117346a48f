"""The operator in high availability: replicas that share kopf's peering object, one acting at a
time. Real operator processes on the real kube-apiserver, the real restate-server and the
stand-in worker; the active replica is SIGKILLed in the middle of a rollout, twice.

What a replica does is read from its own `/metrics`: a supervision pass reports the agent's
versions there (`tether_version_replicas{agent=...}`), so a replica that never acted on the
agent has no such sample, and one that acted keeps them while it lives. `Acting` samples every
replica five times a second; two replicas with samples at once is two replicas acting (the
control test shows that standalone replicas do just that).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kube.controlplane import ControlPlane
from tests.operator.local_proxy import Gate
from tests.operator.op_harness import (
    REPO,
    Cluster,
    OperatorFactory,
    OperatorProcess,
    Restate,
    seconds_fresh,
    wait_for,
)
from tests.operator.test_children import AGENT, manifest, with_secrets
from tests.operator.test_rollout import active, state_of
from tether.programs.restate_server import free_port

PEERING = "tether-operator"
#: The chart's lifetime of a replica's peering record: the takeover measured is the chart's.
LIFETIME = int(
    yaml.safe_load((REPO / "helm" / "tether" / "values.yaml").read_text())["operator"]["peering"][
        "lifetime"
    ]
)
PEERED = {"TETHER_PEERING": PEERING, "TETHER_PEERING_LIFETIME": str(LIFETIME)}
RESUMED = "Resuming operations after the pause"
"""kopf's log line when a replica starts to act: a replica with peering starts paused and
resumes once it has seen no live replica above it."""
TAKEOVER_BOUND = LIFETIME + 15.0
"""A generous bound: the dead record's remaining freshness (at most LIFETIME) plus a pass on a
busy machine."""


class Acting(threading.Thread):
    """Samples each replica's metrics (which replicas act on the agent) and Restate's
    deployments of the agent (which ids each version URL ever had), five times a second."""

    def __init__(self, cluster: Cluster, restate: Restate) -> None:
        super().__init__(daemon=True)
        self.cluster, self.restate = cluster, restate
        self.replicas: dict[str, OperatorProcess] = {}
        self.first: dict[str, float] = {}
        """When each replica was first seen acting (monotonic)."""
        self.together: list[tuple[float, list[str]]] = []
        """Samples in which more than one replica acted."""
        self.ids: dict[str, set[str]] = defaultdict(set)
        """Every Restate deployment id seen for each version URL."""
        self.seen_at: dict[str, float] = {}
        """When each version URL was first seen registered (monotonic)."""
        self.lock = threading.Lock()
        self.done = threading.Event()

    def add(self, name: str, operator: OperatorProcess) -> None:
        with self.lock:
            self.replicas[name] = operator

    def run(self) -> None:
        while not self.done.wait(0.2):
            with self.lock:
                replicas = dict(self.replicas)
            now = time.monotonic()
            ns = self.cluster.namespace
            acting = sorted(name for name, op in replicas.items() if op.supervises(ns, AGENT))
            with self.lock:
                for name in acting:
                    self.first.setdefault(name, now)
                if len(acting) > 1:
                    self.together.append((now, acting))
            try:
                deployments = self.restate.deployments()
            except (OSError, KeyError, ValueError):
                continue
            owner = f"{self.cluster.namespace}/{AGENT}"
            with self.lock:
                for found in deployments.values():
                    if (found.get("metadata") or {}).get("tether.dev/agent") == owner:
                        self.ids[found["uri"]].add(found["id"])
                        self.seen_at.setdefault(found["uri"], now)

    def first_acted(self, name: str) -> float | None:
        with self.lock:
            return self.first.get(name)

    def stop(self) -> None:
        self.done.set()
        self.join(timeout=10)


@contextlib.contextmanager
def peered_a_then_b(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, **a_env: str
) -> Iterator[tuple[Acting, OperatorProcess, OperatorProcess]]:
    """Replicas a (with `a_env` too), then b, sharing the peering object, sampled by an
    `Acting` while in the block: both keep a record, and the older one, a, leads."""
    with_secrets(cluster)
    cluster.create_peering(PEERING)
    acting = Acting(cluster, restate)
    acting.start()
    try:
        a = run_operator(log="a.log", POD_ID="replica-a", **PEERED, **a_env)
        b = run_operator(log="b.log", POD_ID="replica-b", **PEERED)
        acting.add("a", a)
        acting.add("b", b)
        wait_for(
            lambda: set(cluster.peers(PEERING)) == {"replica-a", "replica-b"},
            timeout=30,
            what="both replicas' keep-alive records",
        )
        wait_for(lambda: RESUMED in a.process.log_tail(200_000), timeout=30, what="a to lead")
        yield acting, a, b
    finally:
        acting.stop()


def registered_events(cluster: Cluster, digest: str) -> int:
    return sum(
        1
        for e in cluster.events(AGENT)
        if e["reason"] == "Registered" and (e["message"] or "").startswith(f"version {digest} ")
    )


def kill_and_time_takeover(
    cluster: Cluster, acting: Acting, dying: OperatorProcess, dying_id: str, heir: str
) -> tuple[float, float]:
    """SIGKILL `dying`; when (monotonic), and the seconds until `heir` first acts. Prints the
    breakdown."""
    fresh = seconds_fresh(cluster.peers(PEERING)[dying_id])
    killed = time.monotonic()
    dying.process.kill()
    took_over = wait_for(
        lambda: acting.first_acted(heir),
        timeout=TAKEOVER_BOUND + 30,
        what=f"{heir} to take over",
    )
    takeover = took_over - killed
    print(
        f"\ntakeover by {heir}: {takeover:.1f} s after the SIGKILL (peering lifetime {LIFETIME} s;"
        f" the dead record was fresh for {max(fresh, 0):.1f} s more, the rest is kopf's resume "
        "and the first supervision pass)"
    )
    return killed, takeover


def test_one_replica_acts_and_another_takes_over_a_rollout_when_it_is_killed(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, peering_crds: None
) -> None:
    with peered_a_then_b(cluster, restate, run_operator) as (acting, a, b):
        peers = cluster.peers(PEERING)
        assert peers["replica-a"]["priority"] > peers["replica-b"]["priority"]

        cluster.apply_agent(manifest(system="v1"))
        v1 = wait_for(lambda: active(cluster), timeout=60, what="v1 active")
        v1_id = state_of(cluster, v1)["restateDeploymentId"]
        wait_for(lambda: acting.first_acted("a"), timeout=10, what="a seen acting")
        wait_for(lambda: registered_events(cluster, v1) == 1, timeout=10, what="v1's event")
        # A run parks on v1: pinned there, it keeps v1 draining through the rollout.
        parked_run = restate.send(AGENT, "parked", "park: hold v1")
        awakeable = restate.parked_awakeable(AGENT, "parked")

        # The rollout to v2 starts, and the active replica dies once it applied v2's objects.
        cluster.apply_agent(manifest(system="v2"))
        wait_for(
            lambda: len(cluster.child_names(AGENT)["deployments"]) == 2,
            timeout=30,
            what="a to apply v2's Deployment",
        )
        assert acting.first_acted("b") is None, "the standby acted before the kill"
        assert RESUMED not in b.process.log_tail(200_000), "the standby resumed before the kill"
        killed, first = kill_and_time_takeover(cluster, acting, a, "replica-a", "b")

        v2 = wait_for(lambda: (x := active(cluster)) != v1 and x, timeout=60, what="v2 active")
        v2_id = state_of(cluster, v2)["restateDeploymentId"]
        wait_for(
            lambda: (v := state_of(cluster, v1)).get("inFlight") == 1 and v["state"] == "Draining",
            timeout=30,
            what="v1 draining with its run",
        )
        assert restate.call(AGENT, "fresh", "hello")["version"] == v2

        # a comes back as a new process: the youngest, so a standby, not a leader.
        a2 = run_operator(log="a2.log", POD_ID="replica-a2", **PEERED)
        acting.add("a2", a2)
        wait_for(lambda: "replica-a2" in cluster.peers(PEERING), timeout=30, what="a2's record")
        peers = cluster.peers(PEERING)
        assert peers["replica-a2"]["priority"] < peers["replica-b"]["priority"]
        assert acting.first_acted("a2") is None
        assert RESUMED not in a2.process.log_tail(200_000)

        # b dies while v1 drains: a2 takes over the drain.
        _, second = kill_and_time_takeover(cluster, acting, b, "replica-b", "a2")
        restate.resolve(awakeable, "go")
        assert restate.output(parked_run)["version"] == v1  # the pinned run finished on v1
        wait_for(
            lambda: [v["hash"] for v in cluster.versions(AGENT)] == [v2],
            timeout=60,
            what="v1 retired",
        )

    # Converged: v2 active, v1 drained, unregistered and deleted; nothing half-drained.
    status = cluster.status(AGENT)
    assert status["activeVersion"] == v2 and status["phase"] == "Ready"
    assert state_of(cluster, v2)["restateDeploymentId"] == v2_id
    assert cluster.condition(AGENT, "Draining")["status"] == "False"
    assert restate.deployments_of(cluster.namespace, AGENT) == {v2_id}
    assert v1_id not in restate.deployments()
    name = f"{AGENT}-{v2}"
    assert cluster.child_names(AGENT) == {
        "deployments": {name},
        "services": {name},
        "configmaps": {name},
        "poddisruptionbudgets": {name},
    }
    # Nothing registered twice: one Restate deployment per version URL for the whole test, one
    # registration of v1 (by a) and, unless a had registered v2 just before it died, of v2.
    assert all(len(ids) == 1 for ids in acting.ids.values()), dict(acting.ids)
    sidecar_id = status["sidecar"]["restateDeploymentId"]
    assert set().union(*acting.ids.values()) == {v1_id, v2_id, sidecar_id}
    assert registered_events(cluster, v1) == 1
    # b acted no sooner than a's record expired, seconds after the kill: a v2 registration seen
    # within the first second was a's, in flight as it died.
    v2_url = state_of(cluster, v2)["url"]
    if acting.seen_at[v2_url] < killed + 1.0:
        print("a had registered v2 as it died; b found it registered")
    else:
        assert registered_events(cluster, v2) == 1, cluster.events(AGENT)
    # One replica acted at a time, and each standby only after the kill of the one before.
    assert acting.together == [], acting.together
    assert acting.first_acted("a") is not None
    assert first <= TAKEOVER_BOUND and second <= TAKEOVER_BOUND, (first, second)
    print(f"\ntakeover times: {first:.1f} s, {second:.1f} s (lifetime {LIFETIME} s)")


def test_a_replica_paused_after_it_acted_steps_down(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, peering_crds: None
) -> None:
    """A replica with a higher priority (here set by hand, as `kopf freeze` would) pauses the
    leader; that one exits rather than resume later on what it remembers."""
    with_secrets(cluster)
    cluster.create_peering(PEERING)
    a = run_operator(log="a.log", POD_ID="replica-a", **PEERED)
    cluster.apply_agent(manifest(system="v1"))
    v1 = wait_for(lambda: active(cluster), timeout=60, what="v1 active")

    c = run_operator(log="c.log", POD_ID="replica-c", TETHER_PEERING_PRIORITY="1000", **PEERED)
    wait_for(lambda: not a.process.alive(), timeout=40, what="a to step down and exit")
    assert "another replica of the operator leads now" in a.process.log_tail(200_000)
    # It stopped cleanly: its record is gone at once, nobody waits for it to expire.
    wait_for(lambda: set(cluster.peers(PEERING)) == {"replica-c"}, timeout=10, what="a's record")
    # c leads: a spec change rolls out.
    cluster.apply_agent(manifest(system="v2"))
    wait_for(lambda: (x := active(cluster)) not in (None, v1) and x, timeout=60, what="v2")
    assert c.process.alive()


class ApiGate:
    """The API server's port behind a gate of our own, which `cut` closes (open connections are
    dropped, new ones refused) and `restore` opens again: a replica cut off from the API server
    while everything else still reaches it. `blackhole` drops every packet to and from the gate
    instead (an iptables rule on loopback, root only): requests hang, nothing is refused, and the
    kernel goes on retransmitting what was sent, so a request given up meanwhile can still land
    once the rule goes."""

    def __init__(self, kube_cluster: ControlPlane, directory: Path) -> None:
        config = yaml.safe_load(kube_cluster.kubeconfig.read_text())
        server = urllib.parse.urlsplit(config["clusters"][0]["cluster"]["server"])
        assert server.port is not None
        self.gate = Gate(free_port(), server.port)
        config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{self.gate.port}"
        self.kubeconfig = directory / "gated-kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="api-gate", daemon=True).start()
        self.restore()

    def _do(self, step: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(step, self.loop).result(timeout=10)

    def cut(self) -> None:
        self._do(self.gate.close())

    def restore(self) -> None:
        self._do(self.gate.open())

    @contextlib.contextmanager
    def blackhole(self) -> Iterator[None]:
        port = str(self.gate.port)
        rules = [
            ["INPUT", "-i", "lo", "-p", "tcp", "--dport", port, "-j", "DROP"],
            ["INPUT", "-i", "lo", "-p", "tcp", "--sport", port, "-j", "DROP"],
        ]
        added = []
        try:
            for rule in rules:
                subprocess.run(["iptables", "-I", *rule], check=True)
                added.append(rule)
            yield
        finally:
            for rule in added:
                subprocess.run(["iptables", "-D", *rule], check=True)

    def close(self) -> None:
        self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.mark.parametrize(
    "loss", ["stalled", "cut off from the API server", "blackholed from the API server"]
)
def test_a_leader_that_lost_its_lease_steps_down_and_its_heir_keeps_the_lead(
    loss: str,
    kube_cluster: ControlPlane,
    cluster: Cluster,
    restate: Restate,
    run_operator: OperatorFactory,
    peering_crds: None,
    tmp_path: Path,
) -> None:
    """The leader is lost until the standby has led a rollout it knows nothing of, then comes
    back: stopped (SIGSTOP: a stall, a frozen VM) and continued, its connections to the API
    server cut and restored, or its packets to it dropped and then let through (a blackhole: a
    keep-alive given up meanwhile still lands, late). It is the older one, so kopf alone would
    give it the lead back and make the heir step down; its lease has lapsed, so it sends no
    keep-alive and no write, a late one is refused (`peering.fenced_keep_alive`), and it steps
    down itself, and the heir goes on leading."""
    gate = ApiGate(kube_cluster, tmp_path) if loss != "stalled" else None
    a_env = {"KUBECONFIG": str(gate.kubeconfig)} if gate else {}
    try:
        with peered_a_then_b(cluster, restate, run_operator, **a_env) as (acting, a, b):
            cluster.apply_agent(manifest(system="v1"))
            v1 = wait_for(lambda: active(cluster), timeout=60, what="v1 active")
            wait_for(lambda: acting.first_acted("a"), timeout=10, what="a seen acting")

            lost = contextlib.ExitStack()
            if loss.startswith("blackholed"):
                assert gate is not None
                lost.enter_context(gate.blackhole())
            elif gate:
                gate.cut()
                lost.callback(gate.restore)
            else:
                a.process.signal(signal.SIGSTOP)
                lost.callback(a.process.signal, signal.SIGCONT)
            with lost:
                # b acts once a's record has expired: a's loss has outlasted its lease by then.
                wait_for(
                    lambda: acting.first_acted("b"),
                    timeout=TAKEOVER_BOUND + 30,
                    what="b to take over from a",
                )
                # b rolls out v2, which a never saw.
                cluster.apply_agent(manifest(system="v2"))
                v2 = wait_for(lambda: (x := active(cluster)) != v1 and x, timeout=60, what="v2")
            back = time.monotonic()

            wait_for(lambda: not a.process.alive(), timeout=60, what="a to step down and exit")
            took = time.monotonic() - back
            print(f"\n{loss}: the old leader exited {took:.1f} s after it came back")
            log_a = a.process.log_tail(200_000)
            assert "this replica's lease lapsed" in log_a, log_a[-3000:]
            # Its record went with it (or is stale), and b never saw a live one above its own.
            wait_for(
                lambda: (
                    "replica-a" not in cluster.peers(PEERING)
                    or seconds_fresh(cluster.peers(PEERING)["replica-a"]) <= 0
                ),
                timeout=10,
                what="a's record gone",
            )
            assert b.process.alive()
            log_b = b.process.log_tail(200_000)
            assert "this replica exits" not in log_b and "Pausing operations" not in log_b
            # b still leads: the next spec change rolls out.
            cluster.apply_agent(manifest(system="v3"))
            wait_for(lambda: active(cluster) not in (None, v1, v2), timeout=60, what="v3 by b")
    finally:
        if gate:
            gate.close()
    # Nothing registered twice while both lived.
    assert all(len(ids) == 1 for ids in acting.ids.values()), dict(acting.ids)


def test_a_replica_waits_for_its_peering_object(
    cluster: Cluster,
    restate: Restate,
    run_operator: OperatorFactory,
    peering_crds: None,
    tmp_path: Path,
) -> None:
    """Without the object a replica would stay paused for ever, silently: it says what it waits
    for, and starts once the object is there."""
    started: list[OperatorProcess] = []
    starting = threading.Thread(
        target=lambda: started.append(run_operator(log="a.log", POD_ID="replica-a", **PEERED))
    )
    starting.start()
    try:
        waiting = f"peering: waiting for KopfPeering in {cluster.namespace} {PEERING}"
        wait_for(
            lambda: waiting in (tmp_path / "a.log").read_text(),
            timeout=30,
            what="the replica to say it waits for the object",
        )
        cluster.create_peering(PEERING)
    finally:
        starting.join(timeout=90)
    [a] = started
    assert a.healthy()
    with_secrets(cluster)
    cluster.apply_agent(manifest(system="v1"))
    wait_for(lambda: active(cluster), timeout=60, what="v1 active")
    assert "replica-a" in cluster.peers(PEERING)


def test_control_without_peering_both_replicas_act(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory
) -> None:
    """The observation the tests above rely on: two standalone replicas both act."""
    with_secrets(cluster)
    acting = Acting(cluster, restate)
    acting.start()
    try:
        acting.add("a", run_operator(log="a.log"))
        acting.add("b", run_operator(log="b.log"))
        cluster.apply_agent(manifest(system="v1"))
        wait_for(lambda: acting.together, timeout=60, what="both replicas seen acting")
    finally:
        acting.stop()
