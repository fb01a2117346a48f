"""Restate as a replicated cluster on the real node (the chart's `restate.replicas=3`,
replication 2): the three pods form one cluster, an agent registers with it through the
release's Service, and a run parked on its approval survives the loss of the node that leads
its partition. While that node is down (SIGKILLed, its pod force-deleted and kept from coming
back by a cordon), the approval sent through the agent's sidecar reaches the run and it
completes, and a second run starts and completes; once the node is back on its volume, a third.

A release of its own (`tether-rc` in `tether-rc-system`, its operator serving only
`tether-rc-agents`), removed at the end with both namespaces, their volumes, and the
DurableAgent CRD its install created, so that the user path (`test_user_path.py`, which runs
after this file) starts on a clean cluster. The kopf peering CRDs (the chart's `crds/`) stay:
Helm never deletes them, and the next install finds them.
"""

from __future__ import annotations

import datetime
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from e2e.cluster import Cluster, Report, StepFailed, helm, helm_install, http, wait_for
from e2e.steps import CLERK, E2E, Platform, image_values
from e2e.test_user_path import dump_logs
from tether.programs.restate_cluster import partition_key_of, partition_of_key

RELEASE = "tether-rc"
SYSTEM_NS = "tether-rc-system"
AGENTS_NS = "tether-rc-agents"
RESTATE = f"{RELEASE}-restate"
NODES, REPLICATION = 3, 2
PARTITIONS = 24  # restate-server 1.7's default-num-partitions: the chart leaves it
RESTATE_PODS = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/name=restate"
OPERATOR_PODS = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/name=tether-operator"
CRD = "durableagents.tether.dev"
APPROVED = '{"approved": true}'

_NODE_ID = re.compile(r"My Node ID is (N\d+):(\d+)")
_LEADER = re.compile(r"became Leader of epoch e(\d+)")
_PLACEMENT = re.compile(r"P(\d+)\(v(\d+) \[([^\]]*)\]\)")


def _wall(timestamp: str) -> float:
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


# ------------------------------------------------------------------------------------------------
# What the nodes say about the cluster (Restate 1.7 shows no leaders or placements in SQL, and
# restatectl is not in the image: each node logs them, as JSON with the chart's settings)


@dataclass
class NodeLog:
    """What one node's current container logged: its node id, whether it provisioned the
    cluster, the leaderships it won (partition, epoch, when) and the partitions' placements
    (partition -> version, nodes) it reconciled."""

    pod: str
    node_id: str = ""
    generation: int = 0
    provisioned: bool = False
    leaderships: list[tuple[int, int, float]] = field(default_factory=list)
    placements: dict[int, tuple[int, list[str]]] = field(default_factory=dict)
    metadata_leadership: float = 0.0
    """When it last won the metadata store's Raft leadership (0: not since it started)."""


def node_log(p: Platform, pod: str) -> NodeLog:
    log = NodeLog(pod)
    text = p.kubectl("-n", SYSTEM_NS, "logs", pod, "-c", "restate", check=False)
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the one plain warning about a deprecated setting
        fields = record.get("fields") or {}
        message = str(fields.get("message", ""))
        if match := _NODE_ID.search(message):
            log.node_id, log.generation = match[1], int(match[2])
        elif "has been automatically provisioned" in message:
            log.provisioned = True
        elif message.startswith("Won metadata cluster leadership"):
            log.metadata_leadership = _wall(record["timestamp"])
        elif (match := _LEADER.search(message)) and "partition_id" in fields:
            when = _wall(record["timestamp"])
            log.leaderships.append((int(fields["partition_id"]), int(match[1]), when))
        elif message.startswith("Reconciling partition processors"):
            for partition, version, nodes in _PLACEMENT.findall(message):
                known = log.placements.get(int(partition))
                if known is None or known[0] < int(version):
                    log.placements[int(partition)] = (int(version), nodes.split(", "))
    return log


def node_logs(p: Platform) -> list[NodeLog]:
    return [node_log(p, pod) for pod in p.kubectl.ready_pods(SYSTEM_NS, RESTATE_PODS)]


def leaders(logs: list[NodeLog]) -> dict[int, tuple[int, str, float]]:
    """Partition -> (epoch, pod, when) of the highest leader epoch these nodes won."""
    top: dict[int, tuple[int, str, float]] = {}
    for log in logs:
        for partition, epoch, when in log.leaderships:
            if partition not in top or epoch > top[partition][0]:
                top[partition] = (epoch, log.pod, when)
    return top


def placements(logs: list[NodeLog]) -> dict[int, list[str]]:
    """Partition -> the nodes it is placed on, by its newest placement any node logged."""
    newest: dict[int, tuple[int, list[str]]] = {}
    for log in logs:
        for partition, (version, nodes) in log.placements.items():
            if partition not in newest or newest[partition][0] < version:
                newest[partition] = (version, nodes)
    return {partition: nodes for partition, (_, nodes) in newest.items()}


def cluster_health(p: Platform) -> dict[str, Any] | None:
    """The admin API's `/cluster-health`: the cluster's name and its metadata store's
    members (node numbers), through whichever node the Service's forward reached."""
    status, body = http("GET", f"{p.admin.url}/cluster-health", timeout=10)
    if status == 0:
        p.admin.restart()
    return body if status == 200 and isinstance(body, dict) else None


def every_partition_led(p: Platform, nodes: int = NODES) -> list[NodeLog] | None:
    logs = node_logs(p)
    led = leaders(logs)
    return logs if len(logs) == nodes and set(led) == set(range(PARTITIONS)) else None


def steady_leaders(p: Platform, steady: float = 5, nodes: int = NODES) -> list[NodeLog]:
    """The logs of the `nodes` ready nodes once every partition has a leader and none moved for
    `steady` seconds (the cluster controller spreads the leaders over the nodes after they join,
    and moves some again after a node is lost)."""
    seen: dict[int, tuple[int, str, float]] = {}
    since = time.monotonic()

    def settled() -> list[NodeLog] | None:
        nonlocal seen, since
        logs = every_partition_led(p, nodes)
        now = leaders(logs) if logs else {}
        if now != seen:
            seen, since = now, time.monotonic()
            return None
        return logs if logs and time.monotonic() - since >= steady else None

    logs: list[NodeLog] = wait_for("steady partition leaders", settled, 120, 1)
    return logs


# ------------------------------------------------------------------------------------------------
# The release


def install(p: Platform, report: Report, crd_ours: bool) -> None:
    """The release, with a 3-node Restate; the DurableAgent CRD too when `crd_ours` (none is
    installed yet: the clean-up then deletes it, as it carries this release's name and the
    next release's install would refuse to adopt it)."""
    p.kubectl("create", "namespace", AGENTS_NS)  # before the install: its RoleBinding goes there
    p.kubectl("label", "namespace", AGENTS_NS, "pod-security.kubernetes.io/enforce=restricted")
    p.kubectl(
        "-n", AGENTS_NS, "create", "secret", "generic", "e2e-webhook",
        f"--from-literal=secret={p.secret}",
    )  # fmt: skip
    values = [
        *image_values(p.cluster),
        f"restate.replicas={NODES}",
        f"restate.replication={REPLICATION}",
        f"operator.watchNamespaces[0]={AGENTS_NS}",
        f"crds.install={str(crd_ours).lower()}",
    ]
    started = time.monotonic()
    helm_install(p.cluster, RELEASE, SYSTEM_NS, values)
    wait_for(
        f"{NODES} Restate pods Ready",
        lambda: len(p.kubectl.ready_pods(SYSTEM_NS, RESTATE_PODS)) == NODES,
        300,
        0.5,
    )
    report.time(f"helm install -> {NODES} Restate pods Ready", time.monotonic() - started)
    wait_for(
        "the operator's 2 pods Ready",
        lambda: len(p.kubectl.ready_pods(SYSTEM_NS, OPERATOR_PODS)) == 2,
        300,
        0.5,
    )
    report.time("helm install -> operator Ready", time.monotonic() - started)
    restarts = {
        pod["metadata"]["name"]: c.get("restartCount", 0)
        for pod in p.kubectl.pods(SYSTEM_NS, f"app.kubernetes.io/instance={RELEASE}")
        for c in pod["status"].get("containerStatuses", [])
        if c.get("restartCount", 0)
    }
    if restarts:
        raise StepFailed(f"pods of the release restarted while starting: {restarts}")
    for i in range(NODES):
        claim = p.kubectl.json("-n", SYSTEM_NS, "get", "pvc", f"storage-{RESTATE}-{i}")
        if claim["status"].get("phase") != "Bound":
            raise StepFailed(f"{claim['metadata']['name']} is {claim['status'].get('phase')}")

    # One cluster: the metadata store has the 3 nodes as members, each node joined under its
    # pod's name (only the first provisioned it), every partition has a leader, and each is
    # placed on `REPLICATION` nodes.
    health = wait_for(
        "the metadata store's members to be the 3 nodes",
        lambda: (h := cluster_health(p)) and len(h["metadata_cluster_health"]["members"]) == NODES,
        120,
        0.5,
    )
    health = cluster_health(p)
    if not health or health.get("cluster_name") != RELEASE:
        raise StepFailed(f"/cluster-health answered {health}")
    logs = wait_for("a leader for every partition", lambda: every_partition_led(p), 180, 1)
    report.time("helm install -> every partition led", time.monotonic() - started)
    ids = {log.pod: log.node_id for log in logs}
    if sorted(ids) != [f"{RESTATE}-{i}" for i in range(NODES)] or len(set(ids.values())) != NODES:
        raise StepFailed(f"expected {NODES} nodes, one per pod, got {ids}")
    provisioners = [log.pod for log in logs if log.provisioned]
    if provisioners != [f"{RESTATE}-0"]:
        raise StepFailed(f"expected only {RESTATE}-0 to provision the cluster: {provisioners}")
    placed = placements(logs)
    wrong = {
        partition: nodes
        for partition, nodes in placed.items()
        if len(set(nodes)) != REPLICATION or not set(nodes) <= set(ids.values())
    }
    if set(placed) != set(range(PARTITIONS)) or wrong:
        raise StepFailed(f"partitions not placed on {REPLICATION} of the nodes: {placed}")
    report.fact(
        "Restate cluster",
        f"{health['cluster_name']}: metadata members "
        f"{sorted(health['metadata_cluster_health']['members'])}, nodes {ids}, "
        f"{PARTITIONS} partitions each on {REPLICATION} nodes",
    )


# ------------------------------------------------------------------------------------------------
# Runs


def park(p: Platform, session: str) -> tuple[str, str]:
    """A run of the clerk that parks on its approval: its invocation and awakeable ids."""
    invocation = p.start_run(CLERK, session, "ship the release")
    calls = wait_for("the parked call", lambda: p.parked(CLERK, session), 120, 0.5)
    if [c["tool"] for c in calls] != ["ship"]:
        raise StepFailed(f"expected one parked call of `ship`, got {calls}")
    return invocation, str(calls[0]["awakeable_id"])


def completes(p: Platform, session: str, invocation: str) -> float:
    """The run completed with its approved tool run once; when, by Restate's record."""
    result = p.result(invocation)
    if result.get("status") != "completed" or result.get("tool_calls") != 1:
        raise StepFailed(f"expected a completed run with one tool call, got {result}")
    turns = p.session(CLERK, session)["turns"]
    results = [b for t in turns for b in t["content"] if b["type"] == "tool_result"]
    if len(results) != 1 or results[0].get("is_error"):
        raise StepFailed(f"expected exactly one successful tool result, got {results}")
    (row,) = wait_for(
        f"Restate's record of {invocation}",
        lambda: p.sql(f"SELECT completed_at FROM sys_invocation WHERE id = '{invocation}'"),
        60,
        0.5,
    )
    return _wall(row["completed_at"])


def approve_and_complete(p: Platform, session: str, invocation: str, awakeable: str) -> float:
    p.tether(CLERK, "resolve", awakeable, "--value", APPROVED)
    return completes(p, session, invocation)


def lose_the_leader(p: Platform, report: Report) -> None:
    """A run parks; the node leading its partition is lost. While it is down the approval
    reaches the run, and another run goes from start to completion. Then it comes back."""
    session = f"rc-{secrets.token_hex(4)}"
    invocation, awakeable = park(p, session)
    partition = partition_of_key(partition_key_of(invocation), PARTITIONS)
    logs = steady_leaders(p)
    before = leaders(logs)
    epoch, victim, _ = before[partition]
    led_by_victim = {part: e for part, (e, pod, _) in before.items() if pod == victim}
    (victim_log,) = [log for log in logs if log.pod == victim]
    per_node = {log.pod: sum(1 for _, pod, _ in before.values() if pod == log.pod) for log in logs}
    report.fact("partitions led per node", per_node)
    newest = max(logs, key=lambda log: log.metadata_leadership)
    metadata_leader = newest.pod if newest.metadata_leadership else None  # none logged a win
    report.fact(
        "the lost node",
        f"{victim} ({victim_log.node_id}), leader of the run's partition {partition} (epoch "
        f"e{epoch}) and of {len(led_by_victim)} of {PARTITIONS} partitions"
        + (", and of the metadata store" if victim == metadata_leader else ""),
    )
    claim = p.kubectl.json("-n", SYSTEM_NS, "get", "pvc", f"storage-{victim}")
    host = p.kubectl.json("-n", SYSTEM_NS, "get", "pod", victim)["spec"]["nodeName"]
    # The Kubernetes node is cordoned so that the StatefulSet's replacement stays Pending: the
    # Restate node stays down until it is uncordoned (a lost machine, not a restart).
    p.kubectl("cordon", host)
    try:
        killed = time.time()
        if p.cluster.kill_container is not None:
            p.cluster.kill_container(SYSTEM_NS, victim, "restate")  # SIGKILL: a crash
        p.kubectl(
            "-n", SYSTEM_NS, "delete", "pod", victim, "--grace-period=0", "--force", "--wait=false"
        )
        how = "SIGKILLed, pod force-deleted" if p.cluster.kill_container else "pod force-deleted"
        wait_for(
            f"{victim} not Ready",
            lambda: victim not in p.kubectl.ready_pods(SYSTEM_NS, RESTATE_PODS),
            30,
            0.1,
        )
        p.ingress.restart()  # a forward may have been to the lost pod
        p.admin.restart()

        # The approval, at once (the partition may not have its new leader yet).
        sent = time.time()
        p.tether(CLERK, "resolve", awakeable, "--value", APPROVED)
        accepted = time.time()
        done = completes(p, session, invocation)
        # The approval reached the run when its journal took the next entry (the awakeable's
        # completion), by Restate's record (the journal is kept a day after completion).
        journal = p.sql(f"SELECT appended_at FROM sys_journal WHERE id = '{invocation}'")
        reached = min(w for w in (_wall(row["appended_at"]) for row in journal) if w >= sent)
        report.time(f"node {how} -> approval sent", sent - killed)
        report.time("approval sent -> the sidecar answered (node down)", accepted - sent)
        report.time("approval sent -> journaled in its run (node down)", reached - sent)
        report.time("approval sent -> its run completed (node down)", done - sent)
        report.time("node lost -> the parked run completed", done - killed)

        # How long the lost node's partitions had no leader (the survivors' logs).
        def new_leaders() -> dict[int, tuple[int, str, float]] | None:
            now = leaders(node_logs(p))
            moved = {
                part: now[part]
                for part, old in led_by_victim.items()
                if part in now and now[part][0] > old and now[part][1] != victim
            }
            return moved if len(moved) == len(led_by_victim) else None

        moved = wait_for("new leaders of the lost node's partitions", new_leaders, 60, 0.5)
        report.time("node lost -> the run's partition led again", moved[partition][2] - killed)
        report.time(
            f"node lost -> all {len(moved)} of its partitions led again",
            max(when for _, _, when in moved.values()) - killed,
        )
        replacement = [
            pod["status"].get("phase")
            for pod in p.kubectl.pods(SYSTEM_NS, RESTATE_PODS)
            if pod["metadata"]["name"] == victim
        ]
        if replacement not in ([], ["Pending"]):
            raise StepFailed(f"{victim} came back while its Kubernetes node was cordoned")

        # A whole run while the node is down: started, parked, approved, completed. On a settled
        # cluster (a second round of leader moves came 1-2 s after the first, every partition's
        # epoch went up), so that its times are those of a cluster short of a node.
        steady_leaders(p, nodes=NODES - 1)
        second = f"rc-down-{secrets.token_hex(4)}"
        started = time.time()
        second_invocation, second_awakeable = park(p, second)
        parked = time.time()
        done = approve_and_complete(p, second, second_invocation, second_awakeable)
        report.time("node down: a new run -> parked", parked - started)
        report.time("node down: its approval -> completed", done - parked)
        if victim in p.kubectl.ready_pods(SYSTEM_NS, RESTATE_PODS):
            raise StepFailed(f"{victim} was back before the runs completed")
    finally:
        p.kubectl("uncordon", host, check=False)

    # Back on its volume: the same claim, the same node id (a new generation), all 3 members.
    back = time.monotonic()
    wait_for(
        f"{victim} Ready again",
        lambda: victim in p.kubectl.ready_pods(SYSTEM_NS, RESTATE_PODS),
        300,
        0.5,
    )
    report.time("uncordoned -> the lost node Ready again", time.monotonic() - back)
    again = p.kubectl.json("-n", SYSTEM_NS, "get", "pvc", f"storage-{victim}")
    if again["metadata"]["uid"] != claim["metadata"]["uid"]:
        raise StepFailed(f"{victim} came back on a new volume claim")
    returned = wait_for(
        f"{victim}'s node id", lambda: node_log(p, victim).node_id and node_log(p, victim), 60, 1
    )
    if returned.node_id != victim_log.node_id or returned.generation <= victim_log.generation:
        raise StepFailed(
            f"{victim} came back as {returned.node_id}:{returned.generation}, "
            f"was {victim_log.node_id}:{victim_log.generation}"
        )
    survivors = {
        pod["metadata"]["name"]: c.get("restartCount", 0)
        for pod in p.kubectl.pods(SYSTEM_NS, RESTATE_PODS)
        for c in pod["status"].get("containerStatuses", [])
        if pod["metadata"]["name"] != victim and c.get("restartCount", 0)
    }
    if survivors:
        raise StepFailed(f"the other Restate pods restarted: {survivors}")
    health = cluster_health(p)
    if not health or sorted(health["metadata_cluster_health"]["members"]) != [1, 2, 3]:
        raise StepFailed(f"/cluster-health after the node came back: {health}")
    wait_for("a leader for every partition", lambda: every_partition_led(p), 120, 1)

    third = f"rc-back-{secrets.token_hex(4)}"
    started_third = time.time()
    invocation, awakeable = park(p, third)
    done = approve_and_complete(p, third, invocation, awakeable)
    report.time("node back: a new run -> approved and completed", done - started_third)


# ------------------------------------------------------------------------------------------------
# Clean-up


def clean_up(p: Platform, crd_ours: bool) -> None:
    """Everything of the release gone: its agents (while the operator still runs, to finalize
    them), the release, both namespaces with their pods and volume claims, the volumes, and the
    DurableAgent CRD if this release's install created it."""
    kubectl = p.kubectl
    if kubectl.ok("get", "crd", CRD):
        kubectl("-n", AGENTS_NS, "delete", "durableagents", "--all", "--timeout=120s", check=False)
    helm(
        p.cluster, "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "3m",
        check=False, timeout=240,
    )  # fmt: skip
    if kubectl.ok("get", "crd", CRD):  # an agent the operator did not finalize
        for name in kubectl(
            "-n", AGENTS_NS, "get", "durableagents", "-o", "name", check=False
        ).split():
            kubectl(
                "-n",
                AGENTS_NS,
                "patch",
                name,
                "--type",
                "merge",
                "-p",
                '{"metadata":{"finalizers":null}}',
                check=False,
            )
    kubectl("delete", "namespace", AGENTS_NS, SYSTEM_NS, "--ignore-not-found", "--wait=false")
    wait_for(
        "the release's namespaces gone",
        lambda: (
            not kubectl(
                "get", "namespace", AGENTS_NS, SYSTEM_NS, "--ignore-not-found", "-o", "name"
            )
        ),
        300,
        1,
    )

    def volumes_left() -> list[str]:
        volumes = kubectl.json("get", "pv")["items"]
        return [
            v["metadata"]["name"]
            for v in volumes
            if (v["spec"].get("claimRef") or {}).get("namespace") == SYSTEM_NS
        ]

    wait_for("the release's volumes gone", lambda: not volumes_left(), 120, 1)
    if crd_ours:
        owner = kubectl(
            "get", "crd", CRD, "--ignore-not-found",
            "-o", "jsonpath={.metadata.annotations.meta\\.helm\\.sh/release-name}",
        )  # fmt: skip
        if owner == RELEASE:
            kubectl("delete", "crd", CRD, "--wait=true", timeout=180)


# ------------------------------------------------------------------------------------------------


def run(cluster: Cluster, report: Report) -> None:
    p = Platform(cluster, report, system_ns=SYSTEM_NS, agents_ns=AGENTS_NS, release=RELEASE)
    crd_ours = not p.kubectl.ok("get", "crd", CRD)
    try:
        print("==> 1. helm install with a 3-node Restate cluster", flush=True)
        install(p, report, crd_ours)
        print(f"==> 2. DurableAgent {CLERK} registers with the cluster", flush=True)
        started = time.monotonic()
        p.apply_agent(E2E / "agent.yaml")
        wait_for(f"{CLERK} Ready", lambda: p.ready(CLERK), 300)
        report.time("kubectl apply -> agent Ready", time.monotonic() - started)
        # Registered through one node; the others' metadata has it a moment later.
        wait_for(
            f"{CLERK} registered with the cluster",
            lambda: CLERK in [row["name"] for row in p.sql("SELECT name FROM sys_service")],
            30,
            0.2,
        )
        print("==> 3. the node leading a parked run's partition is lost", flush=True)
        lose_the_leader(p, report)
        if cluster.outside_attempts is not None:
            attempts = cluster.outside_attempts()
            if attempts:
                raise StepFailed("pods attempted outside connections:\n" + "\n".join(attempts))
    except BaseException:
        dump_logs(cluster)
        raise
    finally:
        p.close()
        print("==> 4. clean-up", flush=True)
        cleaning = time.monotonic()
        clean_up(p, crd_ours)
        report.time("clean-up", time.monotonic() - cleaning)
        print(report.table(), flush=True)


def test_restate_cluster(cluster: Cluster) -> None:
    run(cluster, Report())
