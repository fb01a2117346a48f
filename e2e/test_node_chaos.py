"""Chaos on the real node (issue 15, part 3): the scenario of `make chaos`
(`tests.chaos.scenario`: runs of a scripted agent whose tools write a side-effect ledger, some
parked on approvals, some fanning out to sub-agents, one budget per run tree) on the platform
`helm install`ed, while a seeded killer SIGKILLs and force-deletes worker pods, the Restate pod
and the operator pod. Nothing may be lost or run twice.

The agent's tools are the scenario's module in an image made from the e2e's (`chaos_tools` in its
site-packages); its workspace, where the ledger is, is a PersistentVolumeClaim, so the ledger
outlives the pods. `make e2e` runs a short one (CHAOS_SECONDS, CHAOS_RUNS, CHAOS_SEED in the
environment; `make chaos-node` a long one).
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from e2e.cluster import Cluster, PortForward, Report, StepFailed, helm, helm_install, wait_for
from e2e.steps import (
    AGENTS_NS,
    RELEASE,
    SYSTEM_NS,
    WORKER_METRICS_PORT,
    Platform,
    image_values,
    worker_pods,
)
from e2e.test_user_path import dump_logs
from tests.chaos.__main__ import turns
from tests.chaos.scenario import AGENT, LEDGER, manifest, run_scenario, tools_module
from tests.kube.node import KubeNode

CLAIM = "chaos-workspace"
OPERATOR_PODS = "app.kubernetes.io/name=tether-operator"
RESTATE_PODS = "app.kubernetes.io/name=restate"


def chaos_image(base: str, node: KubeNode) -> str:
    """The e2e's image with the scenario's tools importable, loaded on the node."""
    source = tools_module()
    tag = f"tether-e2e/chaos:{hashlib.sha256((base + source).encode()).hexdigest()[:12]}"
    with tempfile.TemporaryDirectory() as context:
        (Path(context) / "chaos_tools.py").write_text(source)
        (Path(context) / "Dockerfile").write_text(
            f"FROM {base}\nCOPY chaos_tools.py /usr/local/lib/python3.11/site-packages/\n"
        )
        subprocess.run(
            ["docker", "build", "-q", "--network", "host", "-t", tag, context],
            check=True,
            capture_output=True,
        )
    node.load_image(tag)
    return tag


class ClusterPlatform:
    """A `tests.chaos.scenario.Platform` on the installed release: forwards to Restate's
    ingress and the agent's sidecar, kills of pods."""

    kill_kinds: tuple[str, ...] = ("worker", "restate", "operator")
    exact_metrics = False  # a worker pod's counts are in its pod, and go with it

    def __init__(self, p: Platform, rng: random.Random) -> None:
        self.p = p
        self.rng = rng
        self.secret = p.secret.encode()
        self._worker_forwards: list[PortForward] = []

    def metrics_urls(self) -> list[str]:
        """The sidecar's `/metrics` and each ready worker pod's (its `metrics` port)."""
        for forward in self._worker_forwards:
            forward.close()
        self._worker_forwards = [
            PortForward(self.p.kubectl, AGENTS_NS, f"pod/{pod}", WORKER_METRICS_PORT)
            for pod in self.p.kubectl.ready_pods(AGENTS_NS, worker_pods(AGENT))
        ]
        workers = [f"{forward.url}/metrics" for forward in self._worker_forwards]
        return [f"{self.sidecar_url}/metrics", *workers]

    def close(self) -> None:
        for forward in self._worker_forwards:
            forward.close()

    @property
    def ingress_url(self) -> str:
        return self.p.ingress.url

    @property
    def sidecar_url(self) -> str:
        return self.p.sidecar(AGENT).url

    def kill(self, kind: str) -> str:
        namespace, selector, container = {
            "worker": (AGENTS_NS, worker_pods(AGENT), "worker"),
            "restate": (SYSTEM_NS, RESTATE_PODS, "restate"),
            "operator": (SYSTEM_NS, OPERATOR_PODS, "operator"),
        }[kind]
        before = self._ready(namespace, selector)
        if not before:
            return f"no {kind} pod was ready: nothing killed"
        uid = self.rng.choice(sorted(before))
        pod = before[uid]
        kill = self.p.cluster.kill_container
        if kill is not None:
            kill(namespace, pod, container)  # SIGKILL: a crash, then the pod goes
        self.p.kubectl("-n", namespace, "delete", "pod", pod, "--grace-period=0", "--force")
        # Back when as many pods are ready as before, the killed one not among them (a
        # StatefulSet's replacement has its name, not its uid).
        wait_for(
            f"as many {kind} pods Ready as before",
            lambda: len(set(self._ready(namespace, selector)) - {uid}) >= len(before),
            180,
            0.5,
        )
        # A forward ends with the pod it picked.
        self.p.ingress.restart()
        self.p.sidecar(AGENT).restart()
        return f"SIGKILLed and force-deleted {kind} pod {pod}"

    def _ready(self, namespace: str, selector: str) -> dict[str, str]:
        """The ready pods' names by uid."""
        ready = self.p.kubectl.ready(namespace, selector)
        return {pod["metadata"]["uid"]: pod["metadata"]["name"] for pod in ready}

    def ledger(self) -> list[str]:
        (pod, *_) = self.p.kubectl.ready_pods(AGENTS_NS, worker_pods(AGENT))
        read = f"import pathlib; print(pathlib.Path('/workspace/{LEDGER}').read_text(), end='')"
        text = self.p.kubectl(
            "-n", AGENTS_NS, "exec", pod, "-c", "worker", "--", "python", "-c", read
        )
        return text.splitlines()


def install(p: Platform, spec: dict[str, Any]) -> None:
    kubectl = p.kubectl
    kubectl("create", "namespace", AGENTS_NS)
    kubectl("label", "namespace", AGENTS_NS, "pod-security.kubernetes.io/enforce=restricted")
    kubectl(
        "-n", AGENTS_NS, "create", "secret", "generic", "e2e-webhook",
        f"--from-literal=secret={p.secret}",
    )  # fmt: skip
    helm_install(p.cluster, RELEASE, SYSTEM_NS, image_values(p.cluster))
    wait_for("Restate Ready", lambda: kubectl.ready_pods(SYSTEM_NS, RESTATE_PODS), 300)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
    }
    agent = {**spec, "spec": {**spec["spec"]}}
    agent["spec"]["webhook"] = {"secretRef": {"name": "e2e-webhook", "key": "secret"}}
    kubectl.apply([claim, agent], AGENTS_NS)
    wait_for(f"{AGENT} Ready", lambda: p.ready(AGENT), 300, 0.5)


def clean_up(p: Platform) -> None:
    kubectl = p.kubectl
    kubectl("-n", AGENTS_NS, "delete", "durableagents", "--all", "--timeout=120s", check=False)
    helm(
        p.cluster, "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", "--timeout", "3m",
        check=False, timeout=240,
    )  # fmt: skip
    for namespace in (AGENTS_NS, SYSTEM_NS):
        kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", check=False)
    kubectl("delete", "crd", "durableagents.tether.dev", check=False)


def test_chaos_on_the_real_node(cluster: Cluster, node: KubeNode, images: dict[str, str]) -> None:
    seconds = float(os.environ.get("CHAOS_SECONDS", "30"))
    runs = int(os.environ.get("CHAOS_RUNS", "20"))
    seed = int(os.environ.get("CHAOS_SEED", "1"))
    spec = manifest(turns(seconds))
    model = spec["spec"]["model"]  # a DurableAgent keys its script by entries, not a mapping
    model["script"] = [{"prompt": k, "responses": v} for k, v in model["script"].items()]
    spec["spec"]["worker"] = {
        "image": chaos_image(images["tether"], node),
        "replicas": 2,
        "workspaceClaim": CLAIM,
    }
    p = Platform(cluster, Report())
    platform: ClusterPlatform | None = None
    try:
        started = time.monotonic()
        install(p, spec)
        print(f"\nplatform and agent ready in {time.monotonic() - started:.1f} s", flush=True)
        rng = random.Random(seed)
        platform = ClusterPlatform(p, random.Random(rng.random()))
        report = run_scenario(
            platform,
            runs=runs,
            chaos_seconds=seconds,
            seed=seed,
            timeout=900 + 4 * seconds,
            log=lambda line: print(line, flush=True),
        )
        print(report.summary(), flush=True)
        if report.violations:
            raise StepFailed(f"{len(report.violations)} violations: {report.violations[:5]}")
    except BaseException:
        dump_logs(cluster)
        raise
    finally:
        if platform is not None:
            platform.close()
        p.close()
        clean_up(p)
