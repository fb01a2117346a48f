"""The user path of Tether on a real cluster: the e2e's steps, shared by every cluster it runs on.

`make e2e` runs them on a real node brought up on this host (`e2e/test_real_node.py`);
`e2e/kind.sh` on a kind cluster (`python e2e/steps.py --kubeconfig ...`). The cluster is a
parameter (:class:`~cluster.Cluster`): a kubeconfig, images already on its nodes, and where it
can tell, the outside connections its pods attempted.

The steps, in order (each checks what a user would look at, and times what a user waits for):
 1. `helm install` the chart (CRD, operator, Restate on a PersistentVolume);
 2. a Prometheus that scrapes the agents' sidecars and Restate;
 3. the e2e agent in a namespace that enforces the `restricted` Pod Security Standard;
 4. a run parks on its approval (`tether_parked_calls` 1 in Prometheus);
 5. its worker pod is force-deleted; the call is still parked on the replacement;
 6. a signed webhook through the sidecar's Service approves it; the run completes with its
    gated tool run once; a second answer is refused; Prometheus saw the replay once and the
    parked gauge back at 0;
 7. a worker pod killed mid-tool, on 1 and on 2 replicas: how long the run stands still; on 2,
    a drain evicts one worker and its PodDisruptionBudget refuses the second;
 8. Restate's pod killed mid-run: the journal survives on its volume and the run completes;
 9. a run that fans out to two sub-agents (fan-out counted in Prometheus); a schedule set by the
    operator starts runs, and stops when the spec drops it; a yearly one runs at once when
    annotated (kubectl annotate ... tether.dev/run-now=...);
    under load the operator adds a worker pod (autoscaling), which runs its share of the runs,
    and takes it away once the load dropped, while runs go on;
    an agent calls an MCP server that runs next to it (examples/kubernetes/mcp-clock.yaml),
    through the egress rule the operator adds for it;
    an agent's worker runs its MCP server itself (stdio), confined by the sandbox in its pod
    (examples/kubernetes/mcp-stdio.yaml);
    every panel of the chart's Grafana dashboard has data in Prometheus;
10. NetworkPolicy: only the operator reaches Restate's admin API; its ingress, the agents and a
    listed namespace;
    only Restate invokes the workers and the sidecar's index;
11. a parked version scales to zero, and so does the idle active version; the approval, through
    the agent's sidecar (its own Deployment), wakes the parked one; a new run wakes the active
    one;
12. a spec change rolls out while the operator's pod is killed: it converges, the old version
    drains and is retired;
13. no pod attempted a connection outside the cluster (where the cluster can tell).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from e2e import dashboard
from e2e.cluster import (
    ROOT,
    Cluster,
    Kubectl,
    PortForward,
    Report,
    StepFailed,
    helm,
    helm_install,
    http,
    wait_for,
)

SYSTEM_NS = "tether-system"
AGENTS_NS = "tether-e2e-agents"
OUTSIDE_NS = "tether-e2e-outside"
CLIENTS_NS = "tether-e2e-clients"  # listed in the chart: may start runs through the ingress
MONITORING_NS = "tether-e2e-monitoring"
RELEASE = "tether"
RESTATE = f"{RELEASE}-restate"
CLERK, RESUME, FANOUT, SCALE = "e2e-clerk", "e2e-resume", "e2e-fanout", "e2e-scale"
MCP_AGENT, MCP_SERVER = "clock-agent", "clock-mcp"  # examples/kubernetes/mcp-clock.yaml
E2E = Path(__file__).resolve().parent
TETHER = ROOT / ".venv" / "bin" / "tether"
AGENT_LABEL = "tether.dev/agent"
VERSION_LABEL = "tether.dev/version"
WORKER_METRICS_PORT = 9090  # a worker pod's own /metrics (tether_operator.names)


def worker_pods(agent: str) -> str:
    """The selector of an agent's worker pods (not its sidecar's)."""
    return f"{AGENT_LABEL}={agent},app.kubernetes.io/component=worker"


class Platform:
    """The e2e's view of an installed Tether: the cluster, forwards to its services, the
    webhook secret, and the report."""

    def __init__(
        self,
        cluster: Cluster,
        report: Report,
        *,
        system_ns: str = SYSTEM_NS,
        agents_ns: str = AGENTS_NS,
        release: str = RELEASE,
    ) -> None:
        self.cluster = cluster
        self.kubectl = Kubectl(cluster)
        self.report = report
        self.secret = secrets.token_urlsafe(32)
        self.agents_ns = agents_ns
        self.ingress = PortForward(self.kubectl, system_ns, f"{release}-restate", 8080)
        self.admin = PortForward(self.kubectl, system_ns, f"{release}-restate", 9070)
        self.prometheus = PortForward(self.kubectl, MONITORING_NS, "prometheus", 9090)
        self.sidecars: dict[str, PortForward] = {}

    def close(self) -> None:
        for forward in (self.ingress, self.admin, self.prometheus, *self.sidecars.values()):
            forward.close()

    # -- agents --------------------------------------------------------------------------------

    def agent_status(self, agent: str) -> dict[str, Any]:
        status: dict[str, Any] = self.kubectl.json(
            "-n", self.agents_ns, "get", "durableagent", agent
        ).get("status", {})
        return status

    def ready(self, agent: str) -> bool:
        conditions = self.agent_status(agent).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def apply_agent(self, path: Path, **spec_changes: Any) -> str:
        document = yaml.safe_load(path.read_text())
        document["spec"].update(spec_changes)
        document["spec"]["webhook"] = {"secretRef": {"name": "e2e-webhook", "key": "secret"}}
        self.kubectl.apply([document], self.agents_ns)
        name: str = document["metadata"]["name"]
        return name

    def sidecar(self, agent: str) -> PortForward:
        if agent not in self.sidecars:
            self.sidecars[agent] = PortForward(
                self.kubectl, self.agents_ns, f"{agent}-sidecar", 8000
            )
        return self.sidecars[agent]

    def tether(self, agent: str, *args: str, check: bool = True) -> str:
        """The `tether` CLI against an agent's sidecar, signed with the webhook secret."""
        sidecar = self.sidecar(agent)
        env = {**os.environ, "TETHER_WEBHOOK_SECRET": self.secret}
        result = subprocess.run(
            [str(TETHER), *args, "--sidecar", sidecar.url],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if check and result.returncode != 0:
            raise StepFailed(f"tether {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout if result.returncode == 0 else ""

    def parked(self, agent: str, session: str) -> list[dict[str, Any]]:
        answer = self.tether(agent, "approvals", "--json", check=False)
        if not answer:
            self.sidecar(agent).restart()
            return []
        calls: list[dict[str, Any]] = yaml.safe_load(answer)["parked"]
        return [c for c in calls if c["session"] == session]

    # -- runs on Restate ------------------------------------------------------------------------

    def start_run(self, agent: str, session: str, prompt: str) -> str:
        status, body = http(
            "POST", f"{self.ingress.url}/{agent}/{session}/run/send", {"prompt": prompt}
        )
        if status != 202:
            raise StepFailed(f"starting a run of {agent} answered {status}: {body}")
        invocation: str = body["invocationId"]
        return invocation

    def result(self, invocation: str, timeout: float = 180) -> dict[str, Any]:
        def attach() -> Any:
            status, body = http(
                "GET", f"{self.ingress.url}/restate/invocation/{invocation}/attach", timeout=30
            )
            if status == 0:
                self.ingress.restart()
            return body if status == 200 else None

        result: dict[str, Any] = wait_for(f"the result of {invocation}", attach, timeout, 1)
        return result

    def session(self, agent: str, session: str) -> dict[str, Any]:
        status, body = http("POST", f"{self.ingress.url}/{agent}/{session}/session")
        if status != 200:
            raise StepFailed(f"reading session {session} answered {status}: {body}")
        return dict(body)

    def sql(self, query: str) -> list[dict[str, Any]]:
        status, body = http(
            "POST",
            f"{self.admin.url}/query",
            {"query": query},
            headers={"accept": "application/json"},
        )
        if status == 0:
            self.admin.restart()
        if status != 200:
            raise StepFailed(f"Restate's SQL answered {status}: {body}")
        rows: list[dict[str, Any]] = body["rows"]
        return rows

    def journal_length(self, invocation: str) -> int:
        rows = self.sql(f"SELECT count(*) AS n FROM sys_journal WHERE id = '{invocation}'")
        return int(rows[0]["n"])

    # -- Prometheus ---------------------------------------------------------------------------

    def metric(self, query: str) -> float | None:
        """The one value of an instant query; None when it has no sample."""
        status, body = http(
            "GET", f"{self.prometheus.url}/api/v1/query?query={_quote(query)}", timeout=10
        )
        if status == 0:
            self.prometheus.restart()
        if status != 200 or body.get("status") != "success":
            return None
        result = body["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def series(self, query: str) -> list[dict[str, Any]]:
        """Every series of an instant query (empty when it has none); a query Prometheus
        refuses fails the step with Prometheus's reason."""
        for _ in range(3):
            status, body = http(
                "GET", f"{self.prometheus.url}/api/v1/query?query={_quote(query)}", timeout=10
            )
            if status != 0:
                break
            self.prometheus.restart()
        else:
            raise StepFailed(f"Prometheus did not answer {query}")
        if status != 200 or not isinstance(body, dict) or body.get("status") != "success":
            reason = body.get("error") if isinstance(body, dict) else body
            raise StepFailed(f"Prometheus refused {query} (HTTP {status}): {reason}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def await_metric(self, query: str, expected: float, timeout: float = 60) -> None:
        wait_for(
            f"Prometheus: {query} == {expected:g} (last: {self.metric(query)})",
            lambda: self.metric(query) == expected,
            timeout,
            1,
        )


def _quote(text: str) -> str:
    import urllib.parse

    return urllib.parse.quote(text, safe="")


# ------------------------------------------------------------------------------------------------
# The steps


def image_values(cluster: Cluster) -> list[str]:
    """The chart's values (`--set`) for the images already on the cluster's nodes."""
    repository, _, tag = cluster.tether_image.rpartition(":")
    values = [f"image.repository={repository}", f"image.tag={tag}", "image.pullPolicy=Never"]
    if cluster.restate_image:
        restate_repository, _, restate_tag = cluster.restate_image.rpartition(":")
        values += [
            f"restate.image.repository={restate_repository}",
            f"restate.image.tag={restate_tag}",
            "restate.image.pullPolicy=Never",
        ]
    return values


def install_platform(p: Platform) -> None:
    cluster = p.cluster
    values = [
        *image_values(cluster),
        f"restate.networkPolicy.scrapeFromNamespaces[0]={MONITORING_NS}",
        f"restate.networkPolicy.ingressFromNamespaces[0]={CLIENTS_NS}",
        "monitoring.dashboard.enabled=true",
    ]
    started = time.monotonic()
    helm_install(cluster, RELEASE, SYSTEM_NS, values)
    selector = "app.kubernetes.io/name=tether-operator"
    wait_for("the operator Ready", lambda: p.kubectl.ready_pods(SYSTEM_NS, selector), 300)
    p.report.time("helm install -> operator Ready", time.monotonic() - started)
    wait_for(
        "Restate Ready",
        lambda: p.kubectl.ready_pods(SYSTEM_NS, "app.kubernetes.io/name=restate"),
        300,
    )
    p.report.time("helm install -> Restate Ready", time.monotonic() - started)
    restarts = sum(
        c.get("restartCount", 0)
        for pod in p.kubectl.pods(SYSTEM_NS, f"app.kubernetes.io/instance={RELEASE}")
        for c in pod["status"].get("containerStatuses", [])
    )
    if restarts:
        raise StepFailed(f"the platform's pods restarted {restarts} times while starting")
    claim = p.kubectl.json("-n", SYSTEM_NS, "get", "pvc", f"storage-{RESTATE}-0")
    if claim["status"].get("phase") != "Bound":
        raise StepFailed(f"Restate's volume claim is {claim['status'].get('phase')}, not Bound")


ALERTS_FILE = "tether-alerts.yml"
"""Where the e2e's Prometheus finds the chart's alerting rules (e2e/prometheus.yaml)."""


def chart_alerts(cluster: Cluster) -> dict[str, Any]:
    """The rule groups of the PrometheusRule the chart renders (`monitoring.alerts.enabled`)."""
    rendered = helm(
        cluster,
        "template",
        RELEASE,
        str(ROOT / "helm" / "tether"),
        "--set",
        "monitoring.alerts.enabled=true",
        "--show-only",
        "templates/alerts.yaml",
    )
    spec: dict[str, Any] = yaml.safe_load(rendered)["spec"]
    return spec


def install_prometheus(p: Platform) -> None:
    text = (
        (E2E / "prometheus.yaml")
        .read_text()
        .replace("PROMETHEUS_IMAGE", p.cluster.prometheus_image)
    )
    objects = yaml.safe_load(text)
    [config] = [o for o in objects["items"] if o["kind"] == "ConfigMap"]
    config["data"][ALERTS_FILE] = yaml.safe_dump(chart_alerts(p.cluster))
    p.kubectl("create", "namespace", MONITORING_NS)
    p.kubectl("apply", "-f", "-", input=json.dumps(objects))
    wait_for("Prometheus Ready", lambda: p.kubectl.ready_pods(MONITORING_NS, "app=prometheus"), 180)
    # Restate's node port is scraped through its NetworkPolicy (scrapeFromNamespaces).
    p.await_metric('sum(up{component="restate"})', 1, timeout=60)


def install_agent(p: Platform) -> None:
    p.kubectl("create", "namespace", AGENTS_NS)
    p.kubectl("label", "namespace", AGENTS_NS, "pod-security.kubernetes.io/enforce=restricted")
    p.kubectl(
        "-n",
        AGENTS_NS,
        "create",
        "secret",
        "generic",
        "e2e-webhook",
        f"--from-literal=secret={p.secret}",
    )
    started = time.monotonic()
    p.apply_agent(E2E / "agent.yaml")
    wait_for(f"{CLERK} Ready", lambda: p.ready(CLERK), 300)
    p.report.time("kubectl apply -> agent Ready", time.monotonic() - started)
    # Prometheus scrapes its sidecar pod and its worker pod.
    p.await_metric(f'sum(up{{namespace="{AGENTS_NS}"}})', 2, timeout=60)


class ClerkRun:
    """The approval run of steps 4-6."""

    session = f"e2e-{secrets.token_hex(4)}"
    invocation = ""
    awakeable = ""
    version = ""


def park(p: Platform, run: ClerkRun) -> None:
    run.version = p.agent_status(CLERK)["activeVersion"]
    run.invocation = p.start_run(CLERK, run.session, "ship the release")
    calls = wait_for("the parked call", lambda: p.parked(CLERK, run.session), 120)
    if [c["tool"] for c in calls] != ["ship"]:
        raise StepFailed(f"expected one parked call of `ship`, got {calls}")
    run.awakeable = calls[0]["awakeable_id"]
    p.await_metric(f'max(tether_parked_calls{{agent="{CLERK}"}})', 1)


def kill_parked_worker(p: Platform, run: ClerkRun) -> None:
    selector = worker_pods(CLERK)
    (pod,) = [x["metadata"]["name"] for x in p.kubectl.pods(AGENTS_NS, selector)]
    p.kubectl("-n", AGENTS_NS, "delete", "pod", pod, "--grace-period=0", "--force")
    wait_for(
        "a replacement worker pod Ready",
        lambda: [x for x in p.kubectl.ready_pods(AGENTS_NS, selector) if x != pod],
        180,
    )
    p.sidecar(CLERK).restart()
    wait_for("the call still parked after the kill", lambda: p.parked(CLERK, run.session), 60)


def approve(p: Platform, run: ClerkRun) -> None:
    p.tether(CLERK, "resolve", run.awakeable, "--value", '{"approved": true}')
    result = p.result(run.invocation)
    if result.get("status") != "completed" or result.get("tool_calls") != 1:
        raise StepFailed(f"expected a completed run with one tool call, got {result}")
    turns = p.session(CLERK, run.session)["turns"]
    results = [b for t in turns for b in t["content"] if b["type"] == "tool_result"]
    if len(results) != 1 or results[0].get("is_error"):
        raise StepFailed(f"expected exactly one successful tool result, got {results}")
    # The shell's sandbox (Landlock, in the pod's kernel): the worker's port and process are
    # out of the command's reach.
    output = json.dumps(results[0]["content"])
    refusals = ("shipped", "PermissionError: [Errno 13]", "kill: Operation not permitted")
    if not all(refusal in output for refusal in refusals):
        raise StepFailed(f"expected the shell's sandbox to refuse {refusals[1:]}: {output}")
    p.report.fact("the shell's sandbox", "the worker's port and process refused to a command")
    if p.tether(CLERK, "resolve", run.awakeable, check=False):
        raise StepFailed("a second answer to the same call was accepted")
    p.await_metric(f'max(tether_parked_calls{{agent="{CLERK}"}})', 0)
    p.await_metric(f'sum(tether_replays_total{{agent="{CLERK}"}})', 1)


REMOVE_MARKER = ("-c", "worker", "--", "rm", "-f", "/workspace/started")


def _pod_running_work(p: Platform, agent: str) -> str | None:
    """The worker pod whose `work` call has started (it leaves /workspace/started)."""
    check = "import os, sys; sys.exit(0 if os.path.exists('/workspace/started') else 1)"
    for pod in p.kubectl.ready_pods(AGENTS_NS, worker_pods(agent)):
        if p.kubectl.ok("-n", AGENTS_NS, "exec", pod, "-c", "worker", "--", "python", "-c", check):
            return pod
    return None


def _wall(timestamp: str) -> float:
    """Seconds since the epoch of one of Restate's ISO timestamps."""
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _next_step_after(
    p: Platform, invocation: str, before: int, since: float, timeout: float
) -> tuple[float, float | None]:
    """Seconds from `since` (wall clock) until the journal of `invocation` grew past `before`
    entries, by Restate's own record of when that entry was appended; and until Restate
    first recorded an attempt's failure after `since` (None if it recorded none). An earlier
    one is not the loss's: an attempt can fail before it, on a connection to a replica the
    previous trial replaced."""
    wait_for(
        "the run's next journaled step",
        lambda: p.journal_length(invocation) > before,
        timeout,
        0.2,
    )
    (row,) = p.sql(
        f"SELECT appended_at FROM sys_journal WHERE id = '{invocation}' AND index = {before}"
    )
    failures = p.sql(
        "SELECT appended_at FROM sys_journal_events "
        f"WHERE id = '{invocation}' AND event_type = 'TransientError'"
    )
    noticed = [_wall(f["appended_at"]) - since for f in failures]
    return _wall(row["appended_at"]) - since, min((n for n in noticed if n >= 0), default=None)


def kill_mid_tool(p: Platform, replicas: int, trials: int = 3) -> None:
    """A worker lost while a run's tool runs: its pod force-deleted (the kubelet gives it 2 s of
    grace), and where the cluster can, its process SIGKILLed (a crash, an OOM kill). Times until
    the run's next journaled step, on the replacement or the other replica."""
    p.apply_agent(E2E / "resume-agent.yaml", worker={"replicas": replicas})
    selector = worker_pods(RESUME)
    wait_for(
        f"{RESUME} Ready on {replicas} pods",
        lambda: (
            p.ready(RESUME)
            and len(p.kubectl.ready_pods(AGENTS_NS, selector)) == replicas
            and len(p.agent_status(RESUME).get("versions", [])) == 1
        ),
        300,
    )
    label = f"{replicas} replica{'s' * (replicas > 1)}"

    def force_delete(pod: str) -> None:
        p.kubectl(
            "-n", AGENTS_NS, "delete", "pod", pod, "--grace-period=0", "--force", "--wait=false"
        )

    losses: list[tuple[str, Callable[[str], None], int]] = [
        ("worker pod force-deleted", force_delete, trials)
    ]
    kill = p.cluster.kill_container
    if kill is not None:
        # Once: a single replica's container crashing again meets the kubelet's restart
        # backoff (10 s, then 20 s, ...), a figure of the kubelet's, not of Tether's.
        losses.append(
            (
                "worker process SIGKILLed",
                lambda pod: kill(AGENTS_NS, pod, "worker"),
                1 if replicas == 1 else trials,
            )
        )
    for loss, inflict, times in losses:
        for trial in range(times):
            session = f"resume-{replicas}-{trial}-{secrets.token_hex(3)}"
            invocation = p.start_run(RESUME, session, "work")
            pod = wait_for("the pod running `work`", lambda: _pod_running_work(p, RESUME), 60, 0.3)
            before = p.journal_length(invocation)
            lost = time.time()
            inflict(pod)
            step, noticed = _next_step_after(p, invocation, before, lost, 120)
            p.report.time(f"{loss} -> next step ({label})", step)
            if noticed is not None:
                p.report.time(f"{loss} -> Restate saw it ({label})", noticed)
            result = p.result(invocation)
            if result.get("status") != "completed":
                raise StepFailed(f"the run after the loss did not complete: {result}")
            turns = p.session(RESUME, session)["turns"]
            outcomes = [b for t in turns for b in t["content"] if b["type"] == "tool_result"]
            if len(outcomes) != 1 or "interrupted" not in str(outcomes[0]).lower():
                raise StepFailed(f"expected `work` reported interrupted once, got {outcomes}")
            # The next trial starts with every replica back, and no marker left behind (a
            # restarted container keeps its pod's /workspace).
            wait_for(
                f"{replicas} ready pods again",
                lambda: len(p.kubectl.ready_pods(AGENTS_NS, selector)) == replicas,
                180,
            )
            for ready in p.kubectl.ready_pods(AGENTS_NS, selector):
                wait_for(
                    f"the marker removed in {ready}",
                    lambda pod=ready: p.kubectl.ok("-n", AGENTS_NS, "exec", pod, *REMOVE_MARKER),
                    60,
                )
    if replicas > 1:
        drain_one_at_a_time(p, selector, replicas)


def evict(p: Platform, pod: str) -> bool:
    """Evict `pod` as a node drain does (the Eviction API); whether it was allowed."""
    body = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": AGENTS_NS},
    }
    path = f"/api/v1/namespaces/{AGENTS_NS}/pods/{pod}/eviction"
    out = p.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(body), check=False)
    return '"Success"' in out


def drain_one_at_a_time(p: Platform, selector: str, replicas: int) -> None:
    """A drain of the node evicts one worker of the version: its PodDisruptionBudget refuses the
    second eviction until the first worker's replacement is ready."""

    def allowing_one() -> dict[str, Any] | None:
        budgets = p.kubectl.json("-n", AGENTS_NS, "get", "pdb", "-l", selector)["items"]
        return next(
            (b for b in budgets if b.get("status", {}).get("disruptionsAllowed") == 1), None
        )

    budget = wait_for("the version's PodDisruptionBudget to allow one eviction", allowing_one, 120)
    first, second = p.kubectl.ready_pods(AGENTS_NS, selector)[:2]
    if not evict(p, first):
        raise StepFailed(f"the first eviction was refused ({budget['metadata']['name']})")
    if evict(p, second):
        raise StepFailed("a second worker was evicted while the first was still being replaced")
    p.report.fact("drain", f"1 of {replicas} workers evicted, the second refused until replaced")
    wait_for(
        f"{replicas} ready pods after the eviction",
        lambda: len(p.kubectl.ready_pods(AGENTS_NS, selector)) == replicas,
        180,
    )


def kill_restate(p: Platform) -> None:
    """Restate's pod killed while a run's tool runs: the run completes from the journal on
    Restate's volume."""
    session = f"restate-kill-{secrets.token_hex(3)}"
    invocation = p.start_run(RESUME, session, "work")
    wait_for("`work` started", lambda: _pod_running_work(p, RESUME), 60, 0.3)
    before = p.journal_length(invocation)
    killed, killed_wall = time.monotonic(), time.time()
    p.kubectl("-n", SYSTEM_NS, "delete", "pod", f"{RESTATE}-0", "--grace-period=0", "--force")
    wait_for(
        "Restate Ready again",
        lambda: p.kubectl.ready_pods(SYSTEM_NS, "app.kubernetes.io/name=restate"),
        180,
    )
    p.report.time("Restate pod killed -> Restate Ready", time.monotonic() - killed)
    p.admin.restart()
    p.ingress.restart()
    step, _ = _next_step_after(p, invocation, before, killed_wall, 180)
    p.report.time("Restate pod killed -> the run's next step", step)
    result = p.result(invocation)
    if result.get("status") != "completed":
        raise StepFailed(f"the run did not complete after Restate's pod was killed: {result}")


def fan_out(p: Platform) -> None:
    p.apply_agent(E2E / "fanout-agent.yaml")
    wait_for(f"{FANOUT} Ready", lambda: p.ready(FANOUT), 300)
    session = f"fanout-{secrets.token_hex(3)}"
    result = p.result(p.start_run(FANOUT, session, "count the fruit"))
    if result.get("status") != "completed":
        raise StepFailed(f"the fan-out run did not complete: {result}")
    [answer] = [  # the named sub-agent's outputs, one section each
        block["content"]
        for turn in p.session(FANOUT, session)["turns"]
        for block in turn["content"]
        if block["type"] == "tool_result"
    ]
    if answer != '[child-1] {"count":3}\n\n[child-2] {"count":3}':
        raise StepFailed(f"the counters' answers are not their outputs: {answer!r}")
    # Its three calls took their slots in the index's pace object, not each worker's own.
    [slot] = p.sql(
        f"SELECT value_utf8 FROM state WHERE service_name = '{FANOUT}-pace' "
        "AND service_key = 'scripted/scripted'"
    )
    if not json.loads(slot["value_utf8"]).get("requests", 0) > 0:
        raise StepFailed(f"the fan-out's model calls took no slot of {FANOUT}-pace: {slot}")
    p.await_metric(f'sum(tether_child_fanout_sum{{agent="{FANOUT}"}})', 2)
    p.await_metric(f'sum(tether_children_total{{agent="{FANOUT}"}})', 2)
    spend_counted(p)
    schedule_runs(p)


def spend_counted(p: Platform) -> None:
    """The agent's spend caps: its pods' calls held and settled in the index's `<agent>-spend`
    through the ingress, the operator's status and gauges show the month's share of the agent's
    cap and the day's of its model's own (one model: the same calls, counted twice)."""

    def counted() -> list[dict[str, Any]]:
        spend = p.agent_status(FANOUT).get("spend", [])
        return spend if len(spend) == 2 and all(s["costUsd"] > 0 for s in spend) else []

    month, day = wait_for("the month's and the day's spend in the status", counted, 60, 1)
    if month["per"] != "month" or "model" in month or not 0 < month["used"] < 1:
        raise StepFailed(f"the agent's spend cap's status is not the month's share: {month}")
    if day.get("model") != "scripted/scripted" or day["costUsd"] != month["costUsd"]:
        raise StepFailed(f"the model's spend cap's status is not its day's: {day} ({month})")
    agents = f'tether_spend_cap_used_ratio{{agent="{FANOUT}",period="month",model=""}}'
    models = f'tether_spend_cap_used_ratio{{agent="{FANOUT}",model="scripted/scripted"}}'
    for query in (agents, models):
        wait_for(f"{query} in Prometheus", lambda q=query: p.series(q), 60, 2)
    p.report.fact("USD the fan-out's calls spent under its monthly cap", month["costUsd"])


def schedule_runs(p: Platform) -> None:
    """A schedule: the operator sets it on Restate through the ingress, signed with the webhook
    key, without a new version; its runs start; dropped from the spec, its tick is gone. Then a
    yearly one, run now by a person with `kubectl annotate`; it stays, for the dashboard."""
    ticks = (
        "SELECT count(*) AS n FROM sys_invocation WHERE status = 'scheduled' "
        f"AND target_service_name = '{FANOUT}-schedule'"
    )
    version = p.agent_status(FANOUT)["activeVersion"]
    census = {"name": "census", "cron": "*/5 * * * * *", "prompt": "count the fruit"}
    p.apply_agent(E2E / "fanout-agent.yaml", schedules=[census])
    set_at = time.monotonic()
    wait_for("the schedule set", lambda: p.agent_status(FANOUT).get("schedules"), 60)

    def completed(name: str) -> bool:  # each run in a session of its own: <name>-<time>...
        status, body = http("POST", f"{p.ingress.url}/{FANOUT}-schedule/{name}/describe")
        last = body.get("session") if status == 200 else None
        return bool(last) and p.session(FANOUT, last)["status"] == "completed"

    wait_for("a scheduled run completed", lambda: completed("census"), 120, 1)
    # The operator's gauge, which TetherScheduleBehind watches, in Prometheus.
    due = f'tether_schedule_next_run_timestamp_seconds{{agent="{FANOUT}",schedule="census"}}'
    wait_for("the schedule's next run in Prometheus", lambda: p.series(due), 60, 2)
    p.report.time("schedule applied -> its first run completed", time.monotonic() - set_at)
    if p.agent_status(FANOUT)["activeVersion"] != version:
        raise StepFailed("adding a schedule rolled out a new version")
    yearly = {"name": "report", "cron": "0 0 1 1 *", "prompt": "count the fruit"}
    p.apply_agent(E2E / "fanout-agent.yaml", schedules=[yearly])
    wait_for(
        "the first schedule stopped, the yearly one set",
        lambda: (
            [s["name"] for s in p.agent_status(FANOUT).get("schedules", [])] == ["report"]
            and p.sql(ticks)[0]["n"] == 1
        ),
        60,
        1,
    )
    # Run now, as a person does: one run, at once, in a session of its own.
    p.kubectl("-n", p.agents_ns, "annotate", "durableagent", FANOUT, "tether.dev/run-now=report@1")
    asked_at = time.monotonic()
    wait_for("the run the annotation started completed", lambda: completed("report"), 60, 1)
    p.report.time("run-now annotated -> its run completed", time.monotonic() - asked_at)

    def shown() -> bool:  # the operator reads the schedules' state from Restate every few s
        status = p.agent_status(FANOUT)
        schedules = status.get("schedules") or [{}]
        return status.get("runNow") == "report@1" and bool(schedules[0].get("lastRun"))

    wait_for("the status shows the run started now as the schedule's last", shown, 60, 1)


SHARED_RUNS = 450
"""Runs counted after the scale-out: ~45 s of the step's load, four of a connection's ages. Of
300, the autoscaled pod ran 43%, 34%, 34% and 19% in four runs: the longer count evens out
where the connections happen to go."""
ADDED_SHARE = 0.15
"""The least share of them the added pod must run. Half is fair; it ran 19-45% of 300 in seven
runs, and 4% with connections that never retire. A connection's traffic moves as one, so the
share is lumpy: the bar sits well below the fair share."""


AUTOSCALING = {
    "activeRunsPerReplica": 3,
    "minReplicas": 1,
    "maxReplicas": 2,
    "scaleDownAfter": "20s",
}
"""The scale agent's: its 8 clients keep 4-8 runs active, which need the second pod; 2 of them
need one."""
STAYING_CLIENTS = 2


def scale_out_under_load(p: Platform, clients: int = 8) -> None:
    """The operator scales the agent's version out under load (`spec.scaling.
    activeRunsPerReplica`), and the added pod runs its share: the Service routes new
    connections, and Restate opens one only when its open ones are busy, or when a worker
    retires one at its age (`tether.programs.worker.connection_age`). Once the load drops to
    two clients, the version goes back to one pod after `scaleDownAfter`, while runs go on (a
    run on the pod that goes continues on the other), and no run failed on the way."""
    p.apply_agent(E2E / "scale-agent.yaml", worker={"replicas": 1}, scaling=AUTOSCALING)
    selector = worker_pods(SCALE)
    wait_for(
        f"{SCALE} Ready on 1 pod",
        lambda: p.ready(SCALE) and len(p.kubectl.ready_pods(AGENTS_NS, selector)) == 1,
        300,
    )
    (first,) = p.kubectl.ready_pods(AGENTS_NS, selector)
    stop, fewer = threading.Event(), threading.Event()
    failures: list[str] = []
    completed: list[int] = []

    def run(session: str) -> None:
        """One run to its end. The clients share one port-forward, whose connections can drop:
        a start is sent again under its idempotency key (one run still), an attach again."""

        def send() -> str | None:
            url = f"{p.ingress.url}/{SCALE}/{session}/run/send"
            status, body = http("POST", url, {"prompt": "go"}, {"idempotency-key": session})
            if status not in (0, 200, 202):
                raise StepFailed(f"starting a run answered {status}: {body}")
            return str(body["invocationId"]) if status else None

        def attach(invocation: str) -> dict[str, Any] | None:
            url = f"{p.ingress.url}/restate/invocation/{invocation}/attach"
            status, body = http("GET", url, timeout=30)
            return body if status == 200 else None

        invocation = wait_for(f"run {session} started", send, 60, 1)
        result = wait_for(f"the end of run {session}", lambda: attach(invocation), 120, 1)
        if result.get("status") != "completed":
            raise StepFailed(f"run {session} ended {result}")

    def client(number: int) -> None:  # one run after another, until stopped
        try:
            for n in itertools.count():
                if stop.is_set() or (fewer.is_set() and number >= STAYING_CLIENTS):
                    return
                run(f"scale-{number}-{n}")
                completed.append(number)
        except StepFailed as failure:
            failures.append(str(failure))

    def runs_on(pod: str) -> float:
        return p.metric(f'sum(tether_runs_total{{agent="{SCALE}", pod="{pod}"}})') or 0.0

    def until(what: str, done: Callable[[], bool], timeout: float) -> None:
        wait_for(what, lambda: done() or failures, timeout, 1)
        if failures:
            raise StepFailed(f"runs failed while the agent scaled: {failures[:3]}")

    def ready_pods() -> int:
        return len(p.kubectl.ready_pods(AGENTS_NS, selector))

    def wanted_pods() -> int:  # what the operator gives the version (its Deployment's replicas)
        found = p.kubectl.json("-n", AGENTS_NS, "get", "deployments", "-l", selector)
        return sum(int(d["spec"].get("replicas", 1)) for d in found["items"])

    run("scale-first")  # from this thread first: it starts the port-forward if need be
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    loaded = time.monotonic()
    for thread in threads:
        thread.start()
    try:
        until("the operator to add a second pod, Ready", lambda: ready_pods() == 2, 180)
        p.report.time("load starts -> the autoscaled pod Ready", time.monotonic() - loaded)
        before = runs_on(first)
        (added,) = set(p.kubectl.ready_pods(AGENTS_NS, selector)) - {first}

        def since() -> tuple[float, float]:  # runs on the added pod, and on both
            on_added = runs_on(added)
            return on_added, on_added + runs_on(first) - before

        until(f"{SHARED_RUNS} runs since {added} was added", lambda: since()[1] >= SHARED_RUNS, 300)
        on_added, runs = since()
        p.report.fact("scale-out", f"the added pod ran {on_added:.0f} of the next {runs:.0f} runs")
        if on_added < ADDED_SHARE * runs:
            raise StepFailed(
                f"the pod added under load ran {on_added:.0f} of the {runs:.0f} runs since; "
                f"expected at least {ADDED_SHARE:.0%}"
            )
        fewer.set()
        dropped = time.monotonic()
        until("the operator to take the second pod away", lambda: wanted_pods() == 1, 120)
        p.report.time(
            f"load drops to {STAYING_CLIENTS} clients -> 1 pod wanted (scaleDownAfter 20s)",
            time.monotonic() - dropped,
        )
        until("the second pod gone", lambda: ready_pods() == 1, 120)
        after = len(completed)
        until("runs after the pod went", lambda: len(completed) >= after + 10, 120)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=180)
    if failures:
        raise StepFailed(f"runs failed as the load ended: {failures[:3]}")
    events = p.kubectl.json("-n", AGENTS_NS, "get", "events", "--field-selector",
                            f"involvedObject.name={SCALE}")["items"]  # fmt: skip
    reasons = [event["reason"] for event in events]
    if "ScaledUp" not in reasons or "ScaledDown" not in reasons:
        raise StepFailed(f"expected the operator's ScaledUp and ScaledDown events: {reasons}")
    p.kubectl("-n", AGENTS_NS, "delete", "durableagent", SCALE, "--wait=false")


def mcp_tools(p: Platform) -> None:
    """The example agent and its MCP server: the agent's pods reach the server's pods only
    through the rule the operator adds to their egress policy; the call is journaled, its
    result lands in the session, and Prometheus counts it."""
    image = p.cluster.mcp_image
    if image is None:
        print("    skipped: no MCP server image on the cluster (--mcp-image)", flush=True)
        return
    example = ROOT / "examples" / "kubernetes" / "mcp-clock.yaml"
    server, service, agent = yaml.safe_load_all(
        example.read_text().replace("MCP_SERVER_IMAGE", image)
    )
    server["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Never"
    agent["spec"]["webhook"] = {"secretRef": {"name": "e2e-webhook", "key": "secret"}}
    token = f"Bearer e2e-{secrets.token_hex(8)}"
    p.kubectl(
        "-n", AGENTS_NS, "create", "secret", "generic", MCP_SERVER,
        f"--from-literal=authorization={token}",
    )  # fmt: skip
    started = time.monotonic()
    p.kubectl.apply([server, service], AGENTS_NS)
    wait_for(
        "the MCP server Ready", lambda: p.kubectl.ready_pods(AGENTS_NS, f"app={MCP_SERVER}"), 180
    )
    p.kubectl.apply([agent], AGENTS_NS)
    wait_for(f"{MCP_AGENT} Ready", lambda: p.ready(MCP_AGENT), 300)
    policy = p.kubectl.json("-n", AGENTS_NS, "get", "networkpolicy", f"{MCP_AGENT}-egress")
    to_server = [
        rule
        for rule in policy["spec"]["egress"]
        for peer in rule.get("to", [])
        if peer.get("podSelector", {}).get("matchLabels") == {"app": MCP_SERVER}
    ]
    if [rule["ports"] for rule in to_server] != [[{"protocol": "TCP", "port": 8080}]]:
        raise StepFailed(f"expected one egress rule to the MCP server's pods on 8080: {policy}")
    config_maps = p.kubectl("-n", AGENTS_NS, "get", "configmaps", "-o", "yaml")
    if token in config_maps:
        raise StepFailed("the MCP server's token is in a ConfigMap")

    clock_call(p, MCP_AGENT, "When is noon UTC in Tokyo?", "T21:00:00+09:00")
    p.report.time("apply MCP server + agent -> MCP result", time.monotonic() - started)
    labels = f'agent="{MCP_AGENT}",server="clock",tool="convert_time",outcome="ok"'
    p.await_metric(f"sum(tether_mcp_calls_total{{{labels}}})", 1)


def clock_call(p: Platform, agent: str, question: str, converted_to: str) -> None:
    """A run of a clock agent (examples/kubernetes/mcp-*.yaml) completes with one MCP call,
    whose result converts noon UTC to the time ending in `converted_to`."""
    session = f"{agent}-{secrets.token_hex(3)}"
    result = p.result(p.start_run(agent, session, question))
    if result.get("status") != "completed" or result.get("tool_calls") != 1:
        raise StepFailed(f"expected a completed run of {agent} with one MCP call, got {result}")
    turns = p.session(agent, session)["turns"]
    [answer] = [b for t in turns for b in t["content"] if b["type"] == "tool_result"]
    converted = json.loads(str(answer["content"])) if not answer.get("is_error") else {}
    if not converted.get("target", {}).get("datetime", "").endswith(converted_to):
        raise StepFailed(f"{agent}'s MCP call did not answer {question!r}: {answer}")


def mcp_stdio(p: Platform) -> None:
    """examples/kubernetes/mcp-stdio.yaml: the worker starts its MCP server itself (stdio), in
    an image made FROM Tether's, confined by the sandbox in the restricted pod (read-only root
    filesystem, non-root); `required: true` fails the run's listing unless the kernel confines
    it. The call returns the converted time, and the agent's egress policy gains no rule."""
    image = p.cluster.mcp_stdio_image
    if image is None:
        print("    skipped: no worker image with the MCP server (--mcp-stdio-image)", flush=True)
        return
    example = ROOT / "examples" / "kubernetes" / "mcp-stdio.yaml"
    agent = yaml.safe_load(example.read_text().replace("MCP_STDIO_IMAGE", image))
    agent["spec"]["webhook"] = {"secretRef": {"name": "e2e-webhook", "key": "secret"}}
    name = agent["metadata"]["name"]
    started = time.monotonic()
    p.kubectl.apply([agent], AGENTS_NS)
    wait_for(f"{name} Ready", lambda: p.ready(name), 300)
    clock_call(p, name, "When is noon UTC in Kolkata?", "T17:30:00+05:30")
    p.report.time("apply agent with a stdio MCP server -> MCP result", time.monotonic() - started)
    egress = {
        who: p.kubectl.json("-n", AGENTS_NS, "get", "networkpolicy", f"{who}-egress")
        for who in (name, CLERK)
    }
    if egress[name]["spec"]["egress"] != egress[CLERK]["spec"]["egress"]:  # DNS, Restate
        raise StepFailed(f"a stdio MCP server changed the agent's egress: {egress[name]}")
    p.kubectl("-n", AGENTS_NS, "delete", "durableagent", name, "--wait=false")


def alerts_evaluate(p: Platform) -> None:
    """Every alerting rule the chart renders evaluates against the platform's real series
    without an error, and the calls the kills above cut off (reported interrupted) fired
    TetherToolCallsInterrupted for their agent and tool."""
    expected = {r["alert"] for group in chart_alerts(p.cluster)["groups"] for r in group["rules"]}

    def loaded() -> list[dict[str, Any]]:
        status, body = http("GET", f"{p.prometheus.url}/api/v1/rules?type=alert", timeout=10)
        if status == 0:
            p.prometheus.restart()
        if status != 200 or not isinstance(body, dict):
            return []
        return [r for group in body["data"]["groups"] for r in group["rules"]]

    def evaluated() -> list[dict[str, Any]] | None:
        rules = loaded()
        done = rules and all(not r["lastEvaluation"].startswith("0001") for r in rules)
        return rules if done else None

    rules = wait_for("the alerting rules evaluated", evaluated, 60)
    if {r["name"] for r in rules} != expected:
        raise StepFailed(f"Prometheus loaded {sorted(r['name'] for r in rules)}, not {expected}")
    failing = [f"{r['name']}: {r.get('lastError')}" for r in rules if r["health"] != "ok"]
    if failing:
        raise StepFailed("alerting rules that fail to evaluate:\n" + "\n".join(failing))

    def interrupted() -> list[dict[str, Any]]:
        return [
            alert
            for r in loaded()
            if r["name"] == "TetherToolCallsInterrupted"
            for alert in r["alerts"]
            if alert["state"] == "firing"
            and alert["labels"].get("agent") == RESUME
            and alert["labels"].get("tool") == "work"
        ]

    [alert] = wait_for("TetherToolCallsInterrupted firing for `work`", interrupted, 60)
    p.report.fact("alerting rules evaluated without an error", len(rules))
    p.report.fact("calls cut off by the kills, as the alert says", alert["value"])


def dashboard_has_data(p: Platform) -> None:
    """Every query of every panel of the chart's Grafana dashboard (the file the chart renders
    into its ConfigMap), with the dashboard's variables as `e2e.dashboard.VARIABLES` fills them
    in (all agents, a 5 m rate interval), returns series from this Prometheus, after the runs
    above: completed and fanned-out runs, an answered approval, replays, an MCP call (whose
    panels are left out where the MCP step was). The ConfigMap holds that file, labelled for
    Grafana's dashboard sidecar."""
    board = dashboard.load()
    name = f"{RELEASE}-dashboard"
    rendered = p.kubectl.json("-n", SYSTEM_NS, "get", "configmap", name)
    if rendered["metadata"].get("labels", {}).get("grafana_dashboard") != "1":
        raise StepFailed(f"ConfigMap {name} is not labelled grafana_dashboard: '1'")
    if json.loads(rendered["data"]["tether.json"]) != board:
        raise StepFailed(f"ConfigMap {name} does not hold {dashboard.DASHBOARD.name}")
    queries = dashboard.queries(board)
    if p.cluster.mcp_image is None:
        queries = [q for q in queries if "tether_mcp_" not in q.expr]
        print("    the MCP panels are left out: no MCP step on this cluster", flush=True)
    variables = dashboard.variable_queries(board)
    checks = [(f"variable ${var}", query) for var, query in variables.items()]
    checks += [(query.name, query.expr) for query in queries]

    def empty() -> list[str]:
        return [f"{what}: {query}" for what, query in checks if not p.series(query)]

    missing = empty()
    deadline = time.monotonic() + 60  # a scrape or two behind the step before
    while missing and time.monotonic() < deadline:
        time.sleep(2)
        missing = empty()
    if missing:
        lines = "\n".join(missing)
        raise StepFailed(f"dashboard panels whose query returns no series:\n{lines}")
    panels = len({query.panel for query in queries})
    p.report.fact("dashboard queries with data", f"{len(checks)}, of {panels} panels")


PROBE = """
import json, socket, sys, time

def connects(address, timeout):
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
        return True
    except OSError:
        return False

expected = json.loads(sys.argv[1])
reached = {}
# A policy implementation learns of a new pod a moment after it starts (a policy on the pod's
# own egress: it is unconfined until then). The addresses that should answer are tried until
# they do; each that should not, until it is refused (how long that took is reported), and then
# three times more: reached if any of those got through, or if it was never refused.
started = time.monotonic()
deadline = started + 30
for name, (address, should) in expected.items():
    if should:
        while not (reached.setdefault(name, connects(address, 2)) or time.monotonic() > deadline):
            time.sleep(0.5)
            reached[name] = connects(address, 2)
refused_after = 0.0
for name, (address, should) in expected.items():
    if not should:
        while connects(address, 2) and time.monotonic() < deadline:
            time.sleep(0.2)
        refused_after = max(refused_after, time.monotonic() - started)
        reached[name] = time.monotonic() >= deadline or any(connects(address, 2) for _ in range(3))
print(json.dumps({"reached": reached, "refused_after": round(refused_after, 2)}))
"""


HTTP_PROBE = """
import json, sys, urllib.error, urllib.request

statuses = {}
for name, url in json.loads(sys.argv[1]).items():
    accept = {"accept": "application/vnd.restate.endpointmanifest.v4+json"}
    request = urllib.request.Request(url, headers=accept)
    try:
        statuses[name] = urllib.request.urlopen(request, timeout=10).status
    except urllib.error.HTTPError as error:
        statuses[name] = error.code
    except OSError as error:
        statuses[name] = type(error).__name__
print(json.dumps(statuses))
"""


def _run_in_pod(
    p: Platform, namespace: str, name: str, labels: dict[str, str], script: str, argument: Any
) -> Any:
    """Run `script` (Python, given `argument` as JSON) in a restricted pod of the image in
    `namespace`; what it printed last, as JSON."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": p.cluster.tether_image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", script, json.dumps(argument)],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    p.kubectl.apply([pod], namespace)
    wait_for(
        f"probe {namespace}/{name} done",
        lambda: (
            p.kubectl.json("-n", namespace, "get", "pod", name)["status"].get("phase")
            in ("Succeeded", "Failed")
        ),
        120,
    )
    logs = p.kubectl("-n", namespace, "logs", name)
    p.kubectl("-n", namespace, "delete", "pod", name, "--wait=false")
    return json.loads(logs.strip().splitlines()[-1])


def _probe(
    p: Platform,
    namespace: str,
    name: str,
    labels: dict[str, str],
    expected: dict[str, tuple[str, bool]],
) -> float:
    """A restricted pod in `namespace` connects to each address; each must answer (True) or
    not (False) as expected. Returns the seconds from the pod's start until the last address
    that must not answer was refused."""
    result = _run_in_pod(p, namespace, name, labels, PROBE, expected)
    reached = result["reached"]
    wanted = {key: should for key, (_, should) in expected.items()}
    if reached != wanted:
        raise StepFailed(
            f"from a pod in {namespace} with labels {labels}: expected {wanted}, got {reached}"
        )
    refused_after: float = result["refused_after"]
    return refused_after


def agents_egress(p: Platform) -> None:
    """A pod of an agent (its tools run there) reaches the cluster's DNS and Restate's ingress,
    and nothing else of the cluster: not another pod, not the API server, not a Service of
    another namespace (the operator's egress policy; the chart's default rules)."""
    labels = {
        "app.kubernetes.io/name": "tether-agent",
        "app.kubernetes.io/managed-by": "tether-operator",
        "tether.dev/agent": CLERK,
    }
    expected = {
        "dns": ("kube-dns.kube-system.svc:53", True),
        "ingress": (f"{RESTATE}.{SYSTEM_NS}.svc:8080", True),
        "a sidecar": (f"{CLERK}-sidecar.{AGENTS_NS}.svc:8000", False),
        "the API server": ("kubernetes.default.svc:443", False),
        "Prometheus": (f"prometheus.{MONITORING_NS}.svc:9090", False),
    }
    refused_after = _probe(p, AGENTS_NS, "egress-probe", labels, expected)
    p.report.fact(
        "agents' egress",
        "DNS and Restate's ingress; no other pod, the API server or Prometheus "
        f"(enforced {refused_after:.2f} s after the probe started)",
    )


def only_restate_invokes_workers(p: Platform) -> None:
    """A pod that reaches a worker (here an agent-labelled one, which shares what a tool of an
    agent reaches) is refused: only requests Restate signed with the chart's key are taken."""
    services = p.kubectl.json("-n", AGENTS_NS, "get", "services", "-l", f"tether.dev/agent={CLERK}")
    [worker] = [s for s in services["items"] if not s["metadata"]["name"].endswith("-sidecar")]
    base = f"http://{worker['metadata']['name']}.{AGENTS_NS}.svc:9080"
    urls = {"health": f"{base}/health", "discover": f"{base}/discover"}
    urls["invoke"] = f"{base}/invoke/{CLERK}/pending"
    # The sidecar's index container too (the parked calls, the live events).
    index = f"http://{CLERK}-sidecar.{AGENTS_NS}.svc:9080"
    urls["index discover"] = f"{index}/discover"
    urls["index invoke"] = f"{index}/invoke/{CLERK}-parked/calls"
    labels = {
        "app.kubernetes.io/name": "tether-agent",
        "app.kubernetes.io/managed-by": "tether-operator",
    }
    statuses = _run_in_pod(p, AGENTS_NS, "worker-probe", labels, HTTP_PROBE, urls)
    expected = {"health": 200, "discover": 401, "invoke": 401}
    if statuses != {**expected, "index discover": 401, "index invoke": 401}:
        raise StepFailed(f"requests to the worker not from Restate answered {statuses}")
    p.report.fact("worker requests not signed by Restate", f"refused: {statuses}")


def network_policy(p: Platform) -> None:
    admin = f"{RESTATE}.{SYSTEM_NS}.svc:9070"
    ingress = f"{RESTATE}.{SYSTEM_NS}.svc:8080"
    # Every probe first reaches the cluster's DNS over TCP: a refusal below is the policy's,
    # not a network that is not up yet.
    dns = ("kube-dns.kube-system.svc:53", True)
    for namespace in (OUTSIDE_NS, CLIENTS_NS):
        p.kubectl("create", "namespace", namespace)
        p.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    # A listed namespace starts runs through the ingress, and reaches nothing else.
    _probe(p, CLIENTS_NS, "probe", {}, {"ingress": (ingress, True), "admin": (admin, False)})
    # Any other namespace reaches neither; nor does a pod of the agents' namespace that is not
    # an agent.
    _probe(
        p,
        OUTSIDE_NS,
        "probe",
        {},
        {"dns": dns, "ingress": (ingress, False), "admin": (admin, False)},
    )
    sidecar = (f"{CLERK}-sidecar.{AGENTS_NS}.svc:8000", True)  # no egress policy selects it
    _probe(
        p,
        AGENTS_NS,
        "probe",
        {},
        {"dns": dns, "sidecar": sidecar, "ingress": (ingress, False), "admin": (admin, False)},
    )
    # The agents' pods reach the ingress (their sidecars start runs and answer calls through
    # it), not the admin API (their tools share their network).
    agent_labels = {
        "app.kubernetes.io/name": "tether-agent",
        "app.kubernetes.io/managed-by": "tether-operator",
    }
    _probe(
        p,
        AGENTS_NS,
        "agent-probe",
        agent_labels,
        {"ingress": (ingress, True), "admin": (admin, False)},
    )
    p.report.fact(
        "NetworkPolicy",
        "admin API: the operator only; ingress: the agents and a listed namespace; nothing else",
    )


def leading_operator(p: Platform) -> str | None:
    """The operator pod that acts: of the fresh keep-alive records in the release's
    ClusterKopfPeering (kopf's identity is the pod's name), the one of highest priority."""
    peering = p.kubectl.json("get", "clusterkopfpeering", f"{RELEASE}-operator")
    now = datetime.datetime.now(datetime.UTC)
    fresh = {
        pod: record["priority"]
        for pod, record in (peering.get("status") or {}).items()
        if datetime.datetime.fromisoformat(record["lastseen"])
        + datetime.timedelta(seconds=int(record["lifetime"]))
        > now
    }
    return max(fresh, key=lambda pod: fresh[pod]) if fresh else None


def rollout_with_operator_killed(p: Platform, run: ClerkRun) -> None:
    first = p.agent_status(CLERK)["activeVersion"]
    started = time.monotonic()
    p.kubectl(
        "-n",
        AGENTS_NS,
        "patch",
        "durableagent",
        CLERK,
        "--type",
        "merge",
        "-p",
        '{"spec": {"system": "v2"}}',
    )
    wait_for(
        "the new version's Deployment",
        lambda: len(p.kubectl.pods(AGENTS_NS, worker_pods(CLERK))) > 1,
        120,
        0.2,
    )
    # The replica that leads (the chart runs two): kill it; the standby takes over once the
    # dead one's peering record expires (operator.peering.lifetime).
    operator = wait_for("a replica to lead", lambda: leading_operator(p), 60, 0.5)
    killed = time.monotonic()
    p.kubectl("-n", SYSTEM_NS, "delete", "pod", operator, "--grace-period=0", "--force")
    wait_for(
        "another replica to lead",
        lambda: leading_operator(p) not in (None, operator),
        120,
        0.2,
    )
    p.report.time("leading operator pod killed -> the standby leads", time.monotonic() - killed)

    def retired() -> bool:
        status = p.agent_status(CLERK)
        active = status.get("activeVersion")
        return bool(
            active
            and active != first
            and [v["hash"] for v in status.get("versions", [])] == [active]
            and not p.kubectl.exists(AGENTS_NS, "deployment", f"{CLERK}-{first}")
        )

    wait_for(f"version {first} retired", retired, 300, 1)
    p.report.time(
        "spec change (operator killed) -> old version retired", time.monotonic() - started
    )


def parked_version_scales_to_zero(p: Platform) -> None:
    """A version whose only run waits for a person goes to zero pods once a new version takes
    the new runs (`scaling.idleAfter`), and so does the new one, idle; the approval, sent to the
    agent's sidecar (its own Deployment), brings a pod of the old one back, and the run
    completes on it. Then a new run wakes the active version. Then `idleAfter` goes, and every
    version has its pods again."""
    session = f"zero-{secrets.token_hex(4)}"
    old = p.agent_status(CLERK)["activeVersion"]
    invocation = p.start_run(CLERK, session, "ship the release")
    (call,) = wait_for("the parked call", lambda: p.parked(CLERK, session), 120)
    change = {"spec": {"system": "v3", "scaling": {"idleAfter": "5s"}}}
    p.kubectl(
        "-n", AGENTS_NS, "patch", "durableagent", CLERK, "--type", "merge", "-p", json.dumps(change)
    )
    deployment = f"{CLERK}-{old}"
    old_pods = f"{AGENT_LABEL}={CLERK},{VERSION_LABEL}={old}"

    def replicas() -> int:
        spec = p.kubectl.json("-n", AGENTS_NS, "get", "deployment", deployment)["spec"]
        return int(spec.get("replicas", 1))

    parked_at = time.monotonic()
    wait_for(
        f"version {old} at zero pods",
        lambda: replicas() == 0 and not p.kubectl.pods(AGENTS_NS, old_pods),
        180,
        0.5,
    )
    p.report.time("new version -> parked old version at zero pods", time.monotonic() - parked_at)
    # What an HPA or KEDA would scale on, from the operator.
    version = f'agent="{CLERK}",version="{old}"'
    p.await_metric(f"max(tether_version_parked_runs{{{version}}})", 1)
    p.await_metric(f"max(tether_version_replicas{{{version}}})", 0)
    active = p.agent_status(CLERK)["activeVersion"]
    active_pods = f"{AGENT_LABEL}={CLERK},{VERSION_LABEL}={active}"
    wait_for(
        f"the active version {active}, idle, at zero pods",
        lambda: not p.kubectl.pods(AGENTS_NS, active_pods),
        180,
        0.5,
    )
    # The spec change rolled the sidecar's pod, where its port-forward ended.
    p.kubectl("-n", AGENTS_NS, "rollout", "status", f"deployment/{CLERK}-sidecar", "--timeout=120s")
    p.sidecar(CLERK).restart()
    answered = time.time()
    p.tether(CLERK, "resolve", call["awakeable_id"], "--value", '{"approved": true}')
    # The woken pod may finish the run and be retired within a second or two: the run's
    # outcome and Restate's and the operator's records tell the story, not a pod seen Ready.
    result = p.result(invocation)
    if result.get("status") != "completed" or result.get("tool_calls") != 1:
        raise StepFailed(f"expected a completed run with one tool call, got {result}")
    rows = p.sql(f"SELECT completed_at FROM sys_invocation WHERE id = '{invocation}'")
    if rows and rows[0].get("completed_at"):  # kept while Restate retains the completion
        done = _wall(rows[0]["completed_at"]) - answered
        p.report.time("approval -> run completed on the version woken from zero", done)
    woke = [
        e
        for e in p.kubectl.json("-n", AGENTS_NS, "get", "events")["items"]
        if e.get("reason") == "WokeUp" and old in e.get("message", "")
    ]
    if not woke:
        raise StepFailed(f"no WokeUp event for version {old}")
    wait_for(
        f"version {old} retired once its run completed",
        lambda: not p.kubectl.exists(AGENTS_NS, "deployment", deployment),
        300,
        1,
    )
    # A new run: Restate finds no pod of the active version and backs off; the operator wakes it.
    # Its first steps run there: it parks on its approval, and completes once approved.
    session = f"wake-{secrets.token_hex(4)}"
    sent = time.monotonic()
    fresh = p.start_run(CLERK, session, "ship it again")
    (call,) = wait_for("the new run's parked call", lambda: p.parked(CLERK, session), 180, 0.5)
    p.report.time(
        "new run -> parked on the active version woken from zero", time.monotonic() - sent
    )
    p.tether(CLERK, "resolve", call["awakeable_id"], "--value", '{"approved": true}')
    outcome = p.result(fresh)
    if outcome.get("status") != "completed":
        raise StepFailed(f"the run sent to the active version at zero pods ended {outcome}")
    unset = {"spec": {"scaling": None}}
    p.kubectl(
        "-n", AGENTS_NS, "patch", "durableagent", CLERK, "--type", "merge", "-p", json.dumps(unset)
    )
    wait_for(
        f"the active version {active} with its pods again",
        lambda: p.kubectl.ready(AGENTS_NS, active_pods),
        180,
        0.5,
    )


def no_phone_home(p: Platform) -> None:
    if p.cluster.outside_attempts is None:
        print("    (this cluster cannot list its pods' outside connections: not checked)")
        return
    attempts = p.cluster.outside_attempts()
    if attempts:
        lines = "\n".join(attempts)
        raise StepFailed(f"pods attempted connections outside the cluster:\n{lines}")
    p.report.fact("outside connections attempted by pods", 0)


Step = tuple[str, Callable[[Platform], None]]


def steps() -> list[Step]:
    run = ClerkRun()
    return [
        ("helm install the platform", install_platform),
        ("Prometheus scrapes the platform", install_prometheus),
        (f"DurableAgent {CLERK} in a restricted namespace", install_agent),
        ("a run parks on its approval", lambda p: park(p, run)),
        (
            "its worker pod is force-deleted while it is parked",
            lambda p: kill_parked_worker(p, run),
        ),
        ("a signed webhook approves it; it completes once", lambda p: approve(p, run)),
        ("a worker killed mid-tool, 1 replica", lambda p: kill_mid_tool(p, 1)),
        ("a worker killed mid-tool, 2 replicas", lambda p: kill_mid_tool(p, 2)),
        ("Restate's pod killed mid-run", kill_restate),
        ("a run fans out to sub-agents; a schedule starts runs", fan_out),
        ("the operator adds a worker pod under load; it runs its share", scale_out_under_load),
        ("an agent calls the MCP server next to it", mcp_tools),
        ("an agent runs its MCP server in its own pod, confined", mcp_stdio),
        ("every panel of the Grafana dashboard has data", dashboard_has_data),
        ("the chart's alerts evaluate; the cut-off calls fired one", alerts_evaluate),
        ("NetworkPolicy in front of Restate's admin API", network_policy),
        ("an agent's pods reach DNS and Restate only", agents_egress),
        ("only Restate invokes the workers", only_restate_invokes_workers),
        ("a parked version scales to zero; its approval wakes it", parked_version_scales_to_zero),
        ("a rollout while the operator is killed", lambda p: rollout_with_operator_killed(p, run)),
        ("no pod phoned home", no_phone_home),
    ]


def run_all(cluster: Cluster, report: Report | None = None) -> Report:
    """Every step in order on `cluster`; raises :class:`StepFailed` at the first that fails."""
    report = report or Report()
    platform = Platform(cluster, report)
    started = time.monotonic()
    try:
        for number, (title, step) in enumerate(steps(), 1):
            print(f"==> {number}. {title}", flush=True)
            step(platform)
    finally:
        platform.close()
    report.time("the whole e2e", time.monotonic() - started)
    print(report.table(), flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the e2e steps on an existing cluster.")
    parser.add_argument("--name", default="cluster")
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--image", required=True, help="the tether image, on the nodes already")
    parser.add_argument("--prometheus-image", required=True)
    parser.add_argument("--restate-image", help="default: the chart's")
    parser.add_argument("--mcp-image", help="the example MCP server's; without it, no MCP step")
    parser.add_argument(
        "--mcp-stdio-image", help="Tether's with that server in it; without it, no stdio step"
    )
    parser.add_argument("--report", type=Path, help="write the timings here as JSON")
    args = parser.parse_args()
    cluster = Cluster(
        name=args.name,
        kubeconfig=args.kubeconfig,
        tether_image=args.image,
        prometheus_image=args.prometheus_image,
        restate_image=args.restate_image,
        mcp_image=args.mcp_image,
        mcp_stdio_image=args.mcp_stdio_image,
    )
    try:
        report = run_all(cluster)
    except StepFailed as error:
        print(f"e2e failed: {error}", file=sys.stderr)
        return 1
    if args.report:
        args.report.write_text(report.as_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
