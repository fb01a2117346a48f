"""The real `tether worker` behind the operator: each version's worker container runs as a real
process (see local_kubelet.py), so runs started through Restate's ingress reach it, park on it,
and drain from it when the spec changes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.operator.local_kubelet import LocalKubelet
from tests.operator.op_harness import (
    Cluster,
    OperatorFactory,
    OperatorProcess,
    Restate,
    dumped_on_failure,
    operator_gauges,
    wait_for,
)
from tether.programs.local_http import request_json as http
from tether.spec.crd import GROUP, PLURAL, VERSION

AGENT = "clerk"
ASK = {"text": "asking", "tool_calls": [{"name": "ask", "input": {"question": "Ship it?"}}]}


def scripted(system: str, script: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {"provider": "scripted", "name": "script", "script": script},
            "system": system,
            "tools": [{"name": "ask", "builtin": "ask_human"}],
            "webhook": {"secretRef": {"name": "hooks", "key": "secret"}},
            "drain": {"delay": "0s", "timeout": "10m"},
        },
    }


@pytest.fixture
def kubelet(cluster: Cluster) -> Iterator[LocalKubelet]:
    cluster.secret("hooks", {"secret": "hmac-key"})
    helper = LocalKubelet(cluster)
    yield helper
    helper.close()


def on_node_ports(run_operator: OperatorFactory) -> OperatorProcess:
    """An operator whose workers Restate reaches on their node ports (the local kubelet's
    processes)."""
    return run_operator(
        TETHER_WORKER_SERVICE_TYPE="NodePort",
        TETHER_WORKER_URL_TEMPLATE="http://127.0.0.1:{node_port}",
    )


def active(cluster: Cluster, other_than: str | None = None) -> str | None:
    status = cluster.status(AGENT)
    registered = cluster.condition(AGENT, "Registered").get("status") == "True"
    digest: str | None = status.get("activeVersion")
    return (
        digest if registered and status.get("phase") == "Ready" and digest != other_than else None
    )


def test_runs_reach_the_real_worker_and_drain_from_it(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, kubelet: LocalKubelet
) -> None:
    on_node_ports(run_operator)
    with dumped_on_failure(kubelet.logs):
        cluster.apply_agent(scripted("v1", [ASK, {"text": "v1: shipped"}]))
        v1 = wait_for(lambda: active(cluster), timeout=90, what="v1 registered")
        parked_run = restate.send(AGENT, "release", "Release 1.4.0")
        calls = wait_for(
            lambda: restate.pending(AGENT, "release"), timeout=60, what="the run to park"
        )
        assert calls[0]["kind"] == "ask_human" and calls[0]["agent"] == AGENT
        wait_for(lambda: cluster.status(AGENT).get("parkedCalls") == 1, timeout=30, what="1 parked")

        cluster.apply_agent(scripted("v2", [{"text": "v2: hello"}]))
        v2 = wait_for(lambda: active(cluster, other_than=v1), timeout=90, what="v2 registered")
        versions = [n for n in kubelet.started if n != f"{AGENT}-sidecar"]
        assert versions == [f"{AGENT}-{v1}", f"{AGENT}-{v2}"]
        assert f"{AGENT}-sidecar" in kubelet.started  # its index: the parked calls
        fresh = restate.call(AGENT, "fresh", "hi", timeout=120)
        assert fresh["status"] == "completed" and fresh["text"] == "v2: hello"
        old = next(v for v in cluster.versions(AGENT) if v["hash"] == v1)
        assert old["state"] == "Draining"

        restate.resolve(calls[0]["awakeable_id"], "yes")
        done = restate.output(parked_run, timeout=120)
        assert done["status"] == "completed" and done["text"] == "v1: shipped"
        wait_for(
            lambda: [v["hash"] for v in cluster.versions(AGENT)] == [v2],
            timeout=60,
            what="v1 retired",
        )
        wait_for(
            lambda: sorted(kubelet.workers) == [f"{AGENT}-{v2}", f"{AGENT}-sidecar"],
            timeout=30,
            what="v1's worker process stopped",
        )
        assert restate.deployments_of(cluster.namespace, AGENT) == {
            cluster.versions(AGENT)[0]["restateDeploymentId"]
        }


def schedule_gauges(url: str, namespace: str) -> dict[str, float]:
    """The operator's `tether_schedule_*` gauges of the schedule `beat`, by name."""
    return operator_gauges(
        url, "tether_schedule_", namespace=namespace, agent=AGENT, schedule="beat"
    )


def test_the_specs_schedules_start_runs_until_the_spec_or_the_agent_drops_them(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, kubelet: LocalKubelet
) -> None:
    operator = on_node_ports(run_operator)
    ingress = restate.server.ingress_url
    every_2s = {"name": "beat", "cron": "*/2 * * * * *", "prompt": "beat", "session": "beats"}
    manifest = scripted("v1", [{"text": f"beat {n}"} for n in range(60)])

    def runs_in(session: str) -> int:
        return len(http("POST", f"{ingress}/{AGENT}/{session}/session").json()["runs"])

    def ticks_waiting() -> int:
        sql = (
            "SELECT count(*) AS n FROM sys_invocation WHERE status = 'scheduled' "
            f"AND target_service_name = '{AGENT}-schedule'"
        )
        return int(restate.server.query(sql)[0]["n"])

    with dumped_on_failure(kubelet.logs):
        manifest["spec"]["schedules"] = [every_2s]
        cluster.apply_agent(manifest)
        wait_for(lambda: active(cluster), timeout=90, what="v1 registered")
        [status] = wait_for(lambda: cluster.status(AGENT).get("schedules"), timeout=30, what="set")
        assert status["name"] == "beat" and status["nextRun"].endswith("Z")
        wait_for(lambda: runs_in("beats") >= 2, timeout=60, what="two scheduled runs")
        # The status shows the schedule as Restate keeps it.
        [status] = wait_for(
            lambda: [s for s in cluster.status(AGENT)["schedules"] if s.get("lastRun")],
            timeout=30,
            what="the last run in the status",
        )
        assert status["lastSession"] == "beats" and status["lateTicks"] == 0
        assert status["lastRun"] < status["nextRun"]
        # The alert's gauges: the next run ahead, the last one behind.
        gauges = wait_for(
            lambda: schedule_gauges(operator.metrics, cluster.namespace) or None,
            timeout=30,
            what="the schedule's gauges",
        )
        next_run = gauges["tether_schedule_next_run_timestamp_seconds"]
        assert gauges["tether_schedule_last_run_timestamp_seconds"] < next_run
        assert next_run > time.time() - 5
        described = http("POST", f"{ingress}/{AGENT}-schedule/beat/describe").json()
        assert described["generation"] == cluster.agent(AGENT)["metadata"]["generation"]

        # Dropped from the spec: stopped on Restate, gone from the status.
        manifest["spec"]["schedules"] = []
        cluster.apply_agent(manifest)
        wait_for(lambda: cluster.status(AGENT).get("schedules") == [], timeout=60, what="gone")
        assert schedule_gauges(operator.metrics, cluster.namespace) == {}
        wait_for(lambda: ticks_waiting() == 0, timeout=10, what="no tick waiting")
        assert http("POST", f"{ingress}/{AGENT}-schedule/beat/describe").json() == {
            "schedule": None
        }

        # Back, then the agent deleted: its ticks are killed before its versions drain.
        manifest["spec"]["schedules"] = [every_2s]
        cluster.apply_agent(manifest)
        wait_for(lambda: ticks_waiting() == 1, timeout=60, what="the schedule set again")
        wait_for(
            lambda: schedule_gauges(operator.metrics, cluster.namespace) or None,
            timeout=30,
            what="the gauges back",
        )
        cluster.delete_agent(AGENT)
        wait_for(lambda: cluster.agent(AGENT) is None, timeout=90, what="the agent deleted")
        assert ticks_waiting() == 0
        assert schedule_gauges(operator.metrics, cluster.namespace) == {}  # gone with the agent


def test_a_person_runs_a_schedule_now_with_an_annotation_once_per_value(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, kubelet: LocalKubelet
) -> None:
    on_node_ports(run_operator)
    ingress = restate.server.ingress_url
    manifest = scripted("v1", [{"text": f"report {n}"} for n in range(10)])
    yearly = {"name": "report", "cron": "0 0 1 1 *", "prompt": "report", "session": "reports"}
    manifest["spec"]["schedules"] = [yearly]

    def annotate(value: str) -> None:
        patch = {"metadata": {"annotations": {"tether.dev/run-now": value}}}
        cluster.objects.patch_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, AGENT, patch
        )

    def runs() -> int:
        return len(http("POST", f"{ingress}/{AGENT}/reports/session").json()["runs"])

    def reasons(reason: str) -> list[str]:
        return [e["message"] for e in cluster.events(AGENT) if e["reason"] == reason]

    with dumped_on_failure(kubelet.logs):
        cluster.apply_agent(manifest)
        wait_for(lambda: active(cluster), timeout=90, what="v1 registered")
        wait_for(lambda: cluster.status(AGENT).get("schedules"), timeout=30, what="set")
        assert runs() == 0
        annotate("report@1")
        wait_for(lambda: runs() == 1, timeout=30, what="the run started now")
        wait_for(lambda: cluster.status(AGENT).get("runNow") == "report@1", timeout=30, what="1")
        [ran] = wait_for(lambda: reasons("RanNow"), timeout=30, what="the RanNow event")
        assert "'reports'" in ran
        # Once per value, not once per pass; a value naming no schedule starts nothing.
        annotate("nope@2")
        wait_for(lambda: reasons("RunNowFailed"), timeout=30, what="the RunNowFailed event")
        assert cluster.status(AGENT)["runNow"] == "nope@2"
        annotate("report@3")
        wait_for(lambda: runs() == 2, timeout=30, what="the second run")
        wait_for(lambda: cluster.status(AGENT).get("runNow") == "report@3", timeout=30, what="3")
        assert runs() == 2 and len(reasons("RanNow")) == 2
        # Its last run (as Restate keeps it, read every few seconds); its next one next year.
        [status] = wait_for(
            lambda: [s for s in cluster.status(AGENT)["schedules"] if s.get("lastRun")],
            timeout=30,
            what="the last run in the status",
        )
        assert status["lastSession"] == "reports" and status["lastRun"] < status["nextRun"]


def test_the_specs_spend_cap_is_counted_across_runs_and_shown_until_it_is_dropped(
    cluster: Cluster, restate: Restate, run_operator: OperatorFactory, kubelet: LocalKubelet
) -> None:
    operator = on_node_ports(run_operator)
    manifest = scripted("v1", [{"text": "ok", "usage": {"input": 200, "output": 50}}])
    manifest["spec"]["model"]["maxTokens"] = 100
    # The agent's cap, and a roomy one of its model's own (by its name), by the calendar of
    # UTC+14, whose month starts at 10:00 UTC on the day before UTC's.
    zone = "Pacific/Kiritimati"
    model_cap = {"per": "month", "maxTokens": 1_000_000, "model": "script", "timeZone": zone}
    caps = [{"per": "day", "maxTokens": 2_000}, model_cap]
    manifest["spec"]["limits"] = {"spendCaps": caps}

    def gauges(per: str = "day", model: str = "") -> dict[str, float]:
        labels = {"namespace": cluster.namespace, "agent": AGENT, "period": per, "model": model}
        return operator_gauges(operator.metrics, "tether_spend_", **labels)

    with dumped_on_failure(kubelet.logs):
        cluster.apply_agent(manifest)
        v1 = wait_for(lambda: active(cluster), timeout=90, what="v1 registered")
        results = [restate.call(AGENT, "s0", "go", timeout=60)]
        while results[-1]["status"] == "completed" and len(results) < 12:
            results.append(restate.call(AGENT, f"s{len(results)}", "go", timeout=60))
        assert results[-1]["status"] == "budget_exceeded", results
        spent = (len(results) - 1) * 250  # each completed run's one call
        status, of_model = wait_for(
            lambda: [s for s in cluster.status(AGENT).get("spend", []) if s["tokens"] == spent],
            timeout=30,
            what="the day's spend in the status",
        )
        assert status["per"] == "day" and status["period"].startswith("day:")
        assert "model" not in status
        assert status["resetsAt"].endswith("T00:00:00Z") and status["used"] == spent / 2_000
        assert wait_for(gauges, timeout=30, what="the gauge") == {
            "tether_spend_cap_used_ratio": spent / 2_000
        }
        # The model's cap: its calls are the agent's here, counted again as its own.
        assert of_model["model"] == "scripted/script" and of_model["period"].startswith("month:")
        assert of_model["period"].endswith(f"@{zone}") and of_model["resetsAt"].endswith(
            "T10:00:00Z"
        )
        assert of_model["used"] == spent / 1_000_000  # counted in the zone's month by Restate
        assert gauges("month", "scripted/script") == {
            "tether_spend_cap_used_ratio": spent / 1_000_000
        }

        # Dropped from the spec: gone from the status and the operator's metrics, and the
        # version without it runs again.
        manifest["spec"]["limits"] = {}
        cluster.apply_agent(manifest)
        wait_for(lambda: cluster.status(AGENT).get("spend") == [], timeout=90, what="dropped")
        assert gauges() == {} and gauges("month", "scripted/script") == {}
        wait_for(lambda: active(cluster, other_than=v1), timeout=90, what="v2 registered")
        assert restate.call(AGENT, "after", "go", timeout=60)["status"] == "completed"
