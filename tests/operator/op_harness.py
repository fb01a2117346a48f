"""Helpers for the operator tests: the operator as a real process, a stand-in worker, Kubernetes
and Restate look-ups, and polling with deadlines (no fixed sleeps)."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client import ApiClient, ApiException
from prometheus_client.parser import text_string_to_metric_families

from tether.parked import PARKED_STATE_KEY
from tether.programs.local_http import request_json
from tether.programs.process_group import GroupProcess
from tether.programs.restate_admin import parse_body
from tether.programs.restate_server import RestateServer, free_port
from tether.spec.crd import GROUP, PLURAL, VERSION
from tether.testing import wait_until

T = TypeVar("T")
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def wait_for(
    predicate: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.1
) -> T:
    """`tether.testing.wait_until`, with the API server's errors as "not yet" too."""
    retrying = (OSError, ApiException, KeyError, ValueError)
    return wait_until(predicate, timeout=timeout, what=what, interval=interval, retrying=retrying)


def http(method: str, url: str, payload: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
    """The status and the JSON body (or text) of one request."""
    response = request_json(method, url, payload, timeout=timeout)
    return response.status, parse_body(response.body)


# ------------------------------------------------------------------------------------------
# Processes


_HYPERCORN = """\
bind = ["127.0.0.1:{port}"]
workers = 1
h2_max_concurrent_streams = 2147483647
keep_alive_max_requests = 2147483647
keep_alive_timeout = 2147483647
graceful_timeout = 2
"""


class StandinWorker:
    """`tests/operator/standin_worker.py` served by the hypercorn CLI on a free port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tether-standin-"))
        config = self.dir / "hypercorn.toml"
        config.write_text(_HYPERCORN.format(port=self.port))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "hypercorn", "--config", str(config), "standin_worker:app"]
        self.process = GroupProcess(argv, env=env, log=self.dir / "standin.log", cwd=HERE)
        wait_for(self._listening, timeout=30, what="the stand-in worker to listen")

    def _listening(self) -> bool:
        if not self.process.alive():
            raise RuntimeError(f"the stand-in worker exited:\n{self.process.log_tail()}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def url_template(self) -> str:
        return f"http://127.0.0.1:{self.port}/{{namespace}}/{{agent}}/{{hash}}"

    def close(self) -> None:
        self.process.stop(grace=5)


@dataclass
class OperatorProcess:
    """`kopf run -m tether_operator` watching one namespace, as a real process."""

    process: GroupProcess
    liveness: str
    metrics: str = ""
    """Its Prometheus metrics (`TETHER_METRICS_PORT`, a free port)."""

    def healthy(self) -> bool:
        status, _ = http("GET", self.liveness, timeout=2)
        return status == 200

    def supervises(self, namespace: str, agent: str) -> bool:
        """Whether this process acts on the agent: each supervision pass reports the agent's
        versions on its /metrics, so one that never acted has none (False once it is gone)."""
        try:
            with urllib.request.urlopen(self.metrics, timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return False
        labels = (f'namespace="{namespace}"', f'agent="{agent}"')
        return any(
            line.startswith("tether_version_replicas{") and all(x in line for x in labels)
            for line in text.splitlines()
        )


OperatorFactory = Callable[..., OperatorProcess]
"""The `run_operator` fixture: start the operator for the test's namespace, settings as kwargs."""


EGRESS_RULES = [
    {
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}}],
        "ports": [{"port": 443, "protocol": "TCP"}],
    }
]
"""The agents' egress rules the operator is started with (the chart renders its own)."""


def start_operator(
    kubeconfig: Path,
    namespace: str,
    env: Mapping[str, str],
    log: Path,
    *,
    entry: str = "kopf",
) -> OperatorProcess:
    """`entry="kopf"`: `kopf run -m tether_operator ...`; `"module"`: `python -m
    tether_operator` (the `tether-operator` command), configured through the environment."""
    port = free_port()
    liveness = f"http://127.0.0.1:{port}/healthz"
    full_env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "PYTHONUNBUFFERED": "1",
        "TETHER_WORKER_IMAGE": "ghcr.io/example/tether:test",
        "TETHER_NAMESPACES": namespace,
        "TETHER_LIVENESS_URL": liveness,
        "TETHER_METRICS_PORT": str(free_port()),
        "TETHER_AGENT_EGRESS": json.dumps(EGRESS_RULES),
        **env,
    }
    metrics = f"http://127.0.0.1:{full_env['TETHER_METRICS_PORT']}/metrics"
    if entry == "module":
        argv = [sys.executable, "-m", "tether_operator"]
    else:
        argv = [sys.executable, "-m", "kopf", "run", "-m", "tether_operator"]
        if not full_env.get("TETHER_PEERING"):
            argv.append("--standalone")  # else TETHER_PEERING makes the replicas peer
        argv += ["-n", namespace, f"--liveness={liveness}"]
    process = GroupProcess(argv, env=full_env, log=log, cwd=REPO)
    operator = OperatorProcess(process, liveness, metrics)

    def up() -> bool:
        if not operator.process.alive():
            raise RuntimeError(f"the operator exited:\n{operator.process.log_tail()}")
        return operator.healthy()

    wait_for(up, timeout=60, what="the operator's liveness endpoint")
    return operator


# ------------------------------------------------------------------------------------------
# Kubernetes


class Cluster:
    """Typed shortcuts over the official client for one namespace."""

    def __init__(self, api: ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.objects = client.CustomObjectsApi(api)

    def apply_agent(self, manifest: dict[str, Any]) -> None:
        body = {**manifest, "metadata": {**manifest["metadata"], "namespace": self.namespace}}
        self.objects.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            body["metadata"]["name"],
            body,
            field_manager="tether-tests",
            force=True,
            _content_type="application/apply-patch+yaml",
        )

    def agent(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.objects.get_namespaced_custom_object(  # type: ignore[assignment]
                GROUP, VERSION, self.namespace, PLURAL, name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    def status(self, name: str) -> dict[str, Any]:
        found = self.agent(name)
        return (found or {}).get("status") or {}

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        for condition in self.status(name).get("conditions", []):
            if condition["type"] == kind:
                found: dict[str, Any] = condition
                return found
        return {}

    def versions(self, name: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.status(name).get("versions", [])
        return found

    def delete_agent(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.objects.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )

    def agents(self) -> list[str]:
        listed: Any = self.objects.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL
        )
        return [item["metadata"]["name"] for item in listed["items"]]

    def secret(self, name: str, data: dict[str, str]) -> None:
        self.core.create_namespaced_secret(
            self.namespace,
            client.V1Secret.model_validate(
                {"metadata": {"name": name}, "stringData": data, "type": "Opaque"}
            ),
        )

    def child_names(self, agent: str, *, sidecar: bool = False) -> dict[str, set[str]]:
        """The names of the agent's versions' objects (its sidecar's, with `sidecar`)."""
        component = "app.kubernetes.io/component" + ("=" if sidecar else "!=") + "sidecar"
        selector = f"tether.dev/agent={agent},{component}"
        ns = self.namespace
        return {
            "deployments": {
                d.metadata.name
                for d in self.apps.list_namespaced_deployment(ns, label_selector=selector).items
                if d.metadata and d.metadata.name
            },
            "services": {
                s.metadata.name
                for s in self.core.list_namespaced_service(ns, label_selector=selector).items
                if s.metadata and s.metadata.name
            },
            "configmaps": {
                c.metadata.name
                for c in self.core.list_namespaced_config_map(ns, label_selector=selector).items
                if c.metadata and c.metadata.name
            },
            "poddisruptionbudgets": {
                b.metadata.name
                for b in self.policy.list_namespaced_pod_disruption_budget(
                    ns, label_selector=selector
                ).items
                if b.metadata and b.metadata.name
            },
        }

    def create_peering(self, name: str) -> None:
        """kopf's KopfPeering object `name` in the namespace (the chart creates it)."""
        body = {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": name}}
        self.objects.create_namespaced_custom_object(
            "kopf.dev", "v1", self.namespace, "kopfpeerings", body
        )

    def peers(self, name: str) -> dict[str, dict[str, Any]]:
        """The keep-alive records in the KopfPeering `name`, by kopf identity."""
        found: Any = self.objects.get_namespaced_custom_object(
            "kopf.dev", "v1", self.namespace, "kopfpeerings", name
        )
        records: dict[str, dict[str, Any]] = found.get("status") or {}
        return records

    def events(self, name: str) -> list[dict[str, Any]]:
        listed = self.core.list_namespaced_event(
            self.namespace,
            field_selector=f"involvedObject.kind=DurableAgent,involvedObject.name={name}",
        )
        return [{"type": e.type, "reason": e.reason, "message": e.message} for e in listed.items]


def seconds_fresh(record: dict[str, Any]) -> float:
    """How long a peering keep-alive record stays fresh from now (kopf: lastseen + lifetime)."""
    seen = datetime.datetime.fromisoformat(record["lastseen"])
    deadline = seen + datetime.timedelta(seconds=int(record["lifetime"]))
    return (deadline - datetime.datetime.now(datetime.UTC)).total_seconds()


def operator_gauges(url: str, prefix: str, **labels: str) -> dict[str, float]:
    """The operator's gauges named `prefix*` whose labels are exactly `labels`, by name."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith(prefix) and sample.labels == labels
    }


# ------------------------------------------------------------------------------------------
# Restate


class Restate:
    def __init__(self, server: RestateServer) -> None:
        self.server = server

    def deployments(self) -> dict[str, dict[str, Any]]:
        _, body = http("GET", f"{self.server.admin_url}/deployments")
        return {d["id"]: d for d in body["deployments"]}

    def deployments_of(self, namespace: str, agent: str, *, sidecar: bool = False) -> set[str]:
        """The agent's versions' deployments (its sidecar's, with `sidecar`)."""
        owner = f"{namespace}/{agent}"
        return {
            i
            for i, d in self.deployments().items()
            if (d.get("metadata") or {}).get("tether.dev/agent") == owner
            and bool(d["metadata"].get("tether.dev/role")) == sidecar
        }

    def send(self, agent: str, session: str, prompt: str) -> str:
        url = f"{self.server.ingress_url}/{agent}/{session}/run/send"
        status, body = http("POST", url, {"prompt": prompt})
        assert status == 202, body
        invocation: str = body["invocationId"]
        return invocation

    def call(self, agent: str, session: str, prompt: str, timeout: float = 60) -> Any:
        url = f"{self.server.ingress_url}/{agent}/{session}/run"
        status, body = http("POST", url, {"prompt": prompt}, timeout=timeout)
        assert status == 200, body
        return body

    def output(self, invocation: str, timeout: float = 60) -> Any:
        url = f"{self.server.ingress_url}/restate/invocation/{invocation}/attach"
        status, body = http("GET", url, timeout=timeout)
        assert status == 200, body
        return body

    def pending(self, agent: str, session: str) -> list[dict[str, Any]]:
        """The session's parked calls with their awakeable ids: read from its state through the
        admin API (the ingress lists calls without ids)."""
        rows = self.server.query(
            f"SELECT value_utf8 FROM state WHERE service_name = '{agent}' "
            f"AND service_key = '{session}' AND key = '{PARKED_STATE_KEY}'"
        )
        calls = [call for row in rows for call in json.loads(row["value_utf8"] or "{}").values()]
        return sorted(calls, key=lambda call: call["created_at"])

    def resolve(self, awakeable: str, value: Any) -> None:
        url = f"{self.server.ingress_url}/restate/awakeables/{awakeable}/resolve"
        status, body = http("POST", url, value)
        assert status in (200, 202), body

    def parked_awakeable(self, agent: str, session: str, timeout: float = 60) -> str:
        calls = wait_for(
            lambda: self.pending(agent, session), timeout=timeout, what=f"{agent}/{session} parked"
        )
        awakeable: str = calls[0]["awakeable_id"]
        return awakeable

    def forget_namespace(self, namespace: str) -> None:
        """Force-unregister every deployment a namespace's agents left (test clean-up): service
        names are global, so one test's leftovers would take the next test's names."""
        for deployment_id, found in self.deployments().items():
            owner = (found.get("metadata") or {}).get("tether.dev/agent", "")
            if owner.startswith(f"{namespace}/"):
                http("DELETE", f"{self.server.admin_url}/deployments/{deployment_id}?force=true")

    def kill_runs(self, agent: str) -> None:
        """Kill every unfinished invocation of the agent (test clean-up)."""
        rows = self.server.query(
            "SELECT id FROM sys_invocation WHERE status != 'completed' "
            f"AND target_service_name = '{agent}'"
        )
        for row in rows:
            http("PATCH", f"{self.server.admin_url}/invocations/{row['id']}/kill")

    def pinned(self, deployment_id: str) -> int:
        rows = self.server.query(
            "SELECT COUNT(*) AS n FROM sys_invocation WHERE status != 'completed' "
            f"AND pinned_deployment_id = '{deployment_id}'"
        )
        return int(rows[0]["n"]) if rows else 0


def finalize_agents(cluster: Cluster, restate: Restate) -> None:
    """Delete every DurableAgent of the namespace (their runs killed first) and wait until the
    running operator's finalizers have let them go (test clean-up)."""
    for name in cluster.agents():
        restate.kill_runs(name)
        cluster.delete_agent(name)
    wait_for(lambda: not cluster.agents(), timeout=60, what="the agents to be deleted")


@contextlib.contextmanager
def dumped_on_failure(*sources: Callable[[], str]) -> Iterator[None]:
    try:
        yield
    except BaseException:
        for source in sources:
            sys.stderr.write(source() + "\n")
        raise
