"""What the e2e steps need from a cluster, and the small tools they reach it with.

Standard library only: `e2e/kind.sh` runs the steps with the project's venv, and nothing here
needs more than `kubectl`, `helm` and HTTP.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OWN_TIMEOUT = re.compile(r"--timeout=(\d+)s")


class StepFailed(AssertionError):
    """A step's check did not hold: the message says what was expected and what was seen."""


@dataclass
class Cluster:
    """A cluster the steps run on.

    The images must already be on the cluster's nodes (`kind load docker-image`, or the real
    node's containerd), so nothing is pulled: pull policy `Never`. `restate_image` None keeps
    the chart's default. `outside_attempts`, where the cluster can tell, lists every connection
    a pod opened to something outside the cluster, in words.
    """

    name: str
    kubeconfig: Path
    tether_image: str
    prometheus_image: str
    restate_image: str | None = None
    mcp_image: str | None = None
    """The example MCP server (examples/kubernetes/mcp-clock.yaml); None skips its step."""
    mcp_stdio_image: str | None = None
    """Tether's image with that server in it (examples/kubernetes/mcp-stdio.yaml); None skips
    its step."""
    kubectl_bin: str = "kubectl"
    helm_bin: str = "helm"
    outside_attempts: Callable[[], list[str]] | None = None
    kill_container: Callable[[str, str, str], None] | None = None
    """SIGKILL a container's main process (namespace, pod, container), where the cluster can."""
    extra_env: dict[str, str] = field(default_factory=dict)


def wait_for(what: str, condition: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Poll until `condition()` is truthy and return it; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except (StepFailed, subprocess.SubprocessError, OSError, ValueError, KeyError) as error:
            last_error = error
        if time.monotonic() > deadline:
            hint = f" (last error: {last_error})" if last_error else ""
            raise StepFailed(f"timed out after {timeout:g}s waiting for {what}{hint}")
        time.sleep(interval)


def helm(cluster: Cluster, *args: str, check: bool = True, timeout: float = 300) -> str:
    """Run helm against the cluster; its output. A failure names the command and its stderr."""
    argv = [cluster.helm_bin, f"--kubeconfig={cluster.kubeconfig}", *args]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise StepFailed(f"helm {' '.join(args[:2])} failed: {result.stderr.strip()}")
    return result.stdout


def helm_install(cluster: Cluster, release: str, namespace: str, values: Sequence[str]) -> None:
    """`helm install` the chart (`helm/tether`) as `release` in `namespace`, `--set` each of
    `values`."""
    sets = [arg for value in values for arg in ("--set", value)]
    chart = str(ROOT / "helm" / "tether")
    helm(cluster, "install", release, chart, "-n", namespace, "--create-namespace", *sets)


class Kubectl:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> str:
        argv = [self.cluster.kubectl_bin, f"--kubeconfig={self.cluster.kubeconfig}", *args]
        # A command with a `--timeout=Ns` of its own gives up by itself, and says why.
        own = [int(match[1]) for arg in args if (match := OWN_TIMEOUT.fullmatch(arg))]
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=max([timeout, *(seconds + 30 for seconds in own)]),
            check=False,
        )
        if check and result.returncode != 0:
            raise StepFailed(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def ok(self, *args: str) -> bool:
        """Whether the command succeeds."""
        argv = [self.cluster.kubectl_bin, f"--kubeconfig={self.cluster.kubeconfig}", *args]
        return subprocess.run(argv, capture_output=True, timeout=60, check=False).returncode == 0

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))

    def apply(self, manifests: Sequence[dict[str, Any]], namespace: str | None = None) -> None:
        document = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(manifests)})
        scope = ["-n", namespace] if namespace else []
        self(*scope, "apply", "-f", "-", input=document)

    def exists(self, namespace: str, kind: str, name: str) -> bool:
        return bool(self("-n", namespace, "get", kind, name, "--ignore-not-found", "-o", "name"))

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.json("-n", namespace, "get", "pods", "-l", selector)[
            "items"
        ]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def ready(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(namespace, selector)
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]

    def ready_pods(self, namespace: str, selector: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.ready(namespace, selector)]


class PortForward:
    """`kubectl port-forward` to a Service (or a `kind/name` such as `pod/x`) on a free local
    port, started again when it dies (a port-forward ends with the pod it picked). A step's
    threads may share one: a lock keeps them from starting it twice."""

    def __init__(self, kubectl: Kubectl, namespace: str, service: str, port: int) -> None:
        self.kubectl, self.namespace, self.service, self.port = kubectl, namespace, service, port
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.RLock()
        self.local_port = 0

    @property
    def url(self) -> str:
        self.ensure()
        return f"http://127.0.0.1:{self.local_port}"

    def ensure(self) -> None:
        with self._lock:
            self._ensure()

    def _ensure(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        cluster = self.kubectl.cluster
        self._process = subprocess.Popen(
            [
                cluster.kubectl_bin,
                f"--kubeconfig={cluster.kubeconfig}",
                "-n",
                self.namespace,
                "port-forward",
                self.service if "/" in self.service else f"svc/{self.service}",
                f":{self.port}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not match:
            self.close()
            raise StepFailed(f"port-forward to {self.service} failed: {line!r}")
        self.local_port = int(match.group(1))

    def restart(self) -> None:
        with self._lock:
            self.close()
            self._ensure()

    def close(self) -> None:
        with self._lock:
            if self._process is not None:
                self._process.kill()
                self._process.wait()
                self._process = None


def http(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, Any]:
    """Status and decoded JSON (or text); status 0 when nothing answered. Never uses proxies."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("content-type", "application/json")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    except (urllib.error.URLError, OSError):
        return 0, None
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


@dataclass
class Report:
    """Timings of the run, printed as a table at the end and written as JSON if asked."""

    timings: dict[str, list[float]] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def time(self, name: str, seconds: float) -> None:
        self.timings.setdefault(name, []).append(round(seconds, 3))
        print(f"    {name}: {seconds:.2f} s", flush=True)

    def fact(self, name: str, value: Any) -> None:
        self.facts[name] = value
        print(f"    {name}: {value}", flush=True)

    def table(self) -> str:
        lines = ["timing                                             runs   median      max"]
        for name, values in self.timings.items():
            ordered = sorted(values)
            median = ordered[len(ordered) // 2]
            lines.append(f"{name:<50} {len(values):>4} {median:>7.2f} s {max(values):>7.2f} s")
        lines += [f"{name}: {value}" for name, value in self.facts.items()]
        return "\n".join(lines)

    def as_json(self) -> str:
        return json.dumps({"timings": self.timings, "facts": self.facts}, indent=2)
