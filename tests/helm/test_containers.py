"""The chart's containers start with the environment the chart gives them: restate-server (the
npm build of the binary in Restate's image) with the StatefulSet's variables, and
`tether-operator` with the operator Deployment's, against the local control plane. Only what a
pod provides differently is replaced: the data directory, loopback addresses, the kubeconfig."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx2

from tests.helm.chart import REPO, by_kind, env_of, one, render
from tests.kube.controlplane import ControlPlane
from tether.programs.process_group import stop_group
from tether.programs.restate_identity import IDENTITY_KEYS_ENV, PRIVATE_KEY_ENV, public_key_of
from tether.programs.restate_install import find_or_install_restate_server
from tether.programs.restate_server import RestateServer, free_port
from tether.testing import wait_until
from tether_operator.settings import IDENTITY_KEY_FILE_ENV


def mount_identity_key(objects: list[Any], settings: dict[str, str], name: str, at: Path) -> str:
    """What the pod's Secret volume provides: the chart's signing key, at `settings[name]`'s
    path (here a file in `at`); its public key."""
    [secret] = by_kind(objects, "Secret")
    pem = base64.b64decode(secret["data"]["private.pem"])
    assert settings[name].endswith("/private.pem")
    (at / "private.pem").write_bytes(pem)
    settings[name] = str(at / "private.pem")
    return public_key_of(pem)


def test_restate_starts_with_the_charts_settings(helm_bin: Path, tmp_path: Path) -> None:
    objects = render(helm_bin)
    container = one(objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    settings = env_of(container)
    assert settings.pop("RESTATE_BASE_DIR") == "/restate-data"  # the PVC's mount: a temp dir here
    key = mount_identity_key(objects, settings, PRIVATE_KEY_ENV, tmp_path)
    with RestateServer(find_or_install_restate_server(), extra_env=settings) as server:
        assert httpx2.get(f"{server.ingress_url}/restate/health", timeout=10).status_code == 200
        # RESTATE_LOG_FORMAT=json took effect: the server logs JSON lines.
        lines = [line for line in server.log_tail(20_000).splitlines() if line.startswith("{")]
        assert lines and all(isinstance(json.loads(line), dict) for line in lines)
        # It signs with the chart's key (the one the operator hands the workers).
        loaded = lambda: f'"kid":"{key}"' in server.log_tail(50_000).replace(" ", "")  # noqa: E731
        wait_until(loaded, what="Restate to load the chart's request identity key")


def test_the_operator_starts_with_the_charts_settings(
    helm_bin: Path,
    kube_cluster: ControlPlane,
    tmp_path: Path,
) -> None:
    kube = kube_cluster
    namespace = f"tether-chart-{uuid.uuid4().hex[:6]}"
    objects = render(helm_bin, f"operator.watchNamespaces={{{namespace}}}")
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    settings = env_of(container)
    assert settings["TETHER_NAMESPACES"] == namespace
    key = mount_identity_key(objects, settings, IDENTITY_KEY_FILE_ENV, tmp_path)
    command = shutil.which(container["command"][0], path=str(Path(sys.executable).parent))
    assert command, f"{container['command'][0]} is not installed next to {sys.executable}"
    liveness = free_port()
    env = {
        **os.environ,
        **settings,
        # The pod's address and Restate's Service are out of reach here: loopback and a port
        # where nothing listens (registration then waits, as the condition will say).
        "TETHER_LIVENESS_URL": f"http://127.0.0.1:{liveness}/healthz",
        "TETHER_METRICS_PORT": str(free_port()),
        "TETHER_RESTATE_ADMIN_URL": f"http://127.0.0.1:{free_port()}",
        "KUBECONFIG": str(kube.kubeconfig),
        "POD_ID": "tether-operator-0",  # the downward API's pod name
    }
    # The chart's CRD, and kopf's peering CRDs from its crds/ (other tests of the session may
    # have applied them already).
    crd = one(objects, "CustomResourceDefinition")
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd))
    kube.kubectl(
        "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=45s"
    )
    peering_crds = REPO / "helm" / "tether" / "crds" / "kopfpeering.yaml"
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(peering_crds))
    kube.kubectl(
        "wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "--timeout=45s"
    )
    kube.kubectl("create", "namespace", namespace)
    # The replicas' peering object, as the chart renders it for the watched namespace.
    peering = one(objects, "KopfPeering")
    assert settings["TETHER_PEERING"] == peering["metadata"]["name"]
    kube.kubectl("apply", "-f", "-", input=json.dumps(peering))
    kube.kubectl("-n", namespace, "create", "secret", "generic", "e2e-webhook",
                 "--from-literal=secret=not-a-real-secret-0123456789")  # fmt: skip
    log = (tmp_path / "operator.log").open("wb")
    operator = subprocess.Popen(
        [command, *container.get("args", [])],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def healthy() -> bool:
            assert operator.poll() is None, (tmp_path / "operator.log").read_text()[-4000:]
            try:
                return httpx2.get(env["TETHER_LIVENESS_URL"], timeout=2).status_code == 200
            except httpx2.HTTPError:
                return False

        wait_until(healthy, what="the operator's liveness endpoint")
        metrics = f"http://127.0.0.1:{env['TETHER_METRICS_PORT']}/metrics"
        assert httpx2.get(metrics, timeout=5).status_code == 200
        kube.kubectl("-n", namespace, "apply", "-f", str(REPO / "e2e" / "agent.yaml"))

        def version_deployment() -> dict[str, Any] | None:
            listed = kube.kubectl(
                "-n", namespace, "get", "deployments", "-o", "json",
                "-l", "tether.dev/agent=e2e-clerk,app.kubernetes.io/component=worker",
            )  # fmt: skip
            items = json.loads(listed.stdout)["items"]
            return items[0] if items else None

        deployment = wait_until(version_deployment, what="the agent's version Deployment")
        pod = deployment["spec"]["template"]["spec"]
        images = {c["image"] for c in pod["containers"]}
        assert images == {settings["TETHER_WORKER_IMAGE"]}
        worker = next(c for c in pod["containers"] if c["name"] == "worker")
        assert env_of(worker)[IDENTITY_KEYS_ENV] == key  # it takes only Restate's requests
        assert {c["imagePullPolicy"] for c in pod["containers"]} == {"IfNotPresent"}

        def unreachable() -> bool:
            got = kube.kubectl("-n", namespace, "get", "durableagent", "e2e-clerk", "-o", "json")
            conditions = json.loads(got.stdout).get("status", {}).get("conditions", [])
            return any(c.get("reason") == "RestateUnreachable" for c in conditions)

        wait_until(unreachable, what="Registered=False RestateUnreachable")
        # It acted as the leader of the peering, under the pod's name.
        got = kube.kubectl("-n", namespace, "get", "kopfpeering", settings["TETHER_PEERING"],
                           "-o", "json")  # fmt: skip
        assert set(json.loads(got.stdout)["status"]) == {"tether-operator-0"}
        kube.kubectl("-n", namespace, "delete", "durableagent", "e2e-clerk", "--wait=false")
    finally:
        stop_group(operator, grace=10)
        log.close()
        kube.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
