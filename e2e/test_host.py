"""The real node leaves this host as it found it: after a normal stop, and after a test run
that was killed (SIGKILL) with its node up, once the next run has come and gone."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.kube.controlplane import ControlPlane
from tests.kube.host import differences, snapshot
from tests.kube.node import SYSCTLS, KubeNode
from tether.testing import wait_until

ROOT = Path(__file__).resolve().parents[1]


def workload(image: str) -> dict[str, Any]:
    """A pod that writes to a provisioned volume, behind a Service."""
    labels = {"app": "host-check"}
    return {
        "apiVersion": "v1",
        "kind": "List",
        "items": [
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "namespace": "default"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "10Mi"}},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "host-check", "namespace": "default", "labels": labels},
                "spec": {
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", "echo written > /data/proof && sleep 3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        }
                    ],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "host-check", "namespace": "default"},
                "spec": {"selector": labels, "ports": [{"port": 80}]},
            },
        ],
    }


def run_workload(plane: ControlPlane, image: str) -> None:
    plane.kubectl("apply", "-f", "-", input=json.dumps(workload(image)))
    wait_until(
        lambda: (
            plane.kubectl(
                "exec", "host-check", "--", "cat", "/data/proof", check=False
            ).stdout.strip()
            == "written"
        ),
        timeout=120,
        what="the pod writing to its volume",
    )


def test_a_stopped_node_leaves_the_host_as_it_was(images: dict[str, str]) -> None:
    before = snapshot(SYSCTLS)
    with KubeNode(images) as plane:
        run_workload(plane, images["base"])
        assert differences(before, snapshot(SYSCTLS)), "a running node changes the host"
    assert differences(before, snapshot(SYSCTLS)) == []


HOLDER = """
import json, sys, time
sys.path.insert(0, {root!r})
from tests.kube.node import KubeNode
from e2e.test_host import run_workload
images = json.loads(sys.argv[1])
plane = KubeNode(images).start()
run_workload(plane, images["base"])
print("up", flush=True)
time.sleep(3600)
"""


def test_a_killed_run_leaves_nothing_the_next_one_does_not_undo(images: dict[str, str]) -> None:
    before = snapshot(SYSCTLS)
    code = HOLDER.format(root=str(ROOT))
    holder = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(images)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "up", "the node of the child did not start"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # Its kubelet, containerd, pods, mounts and rules live on: the next run finds and undoes them.
    assert differences(before, snapshot(SYSCTLS)), "the killed run left nothing behind"
    with KubeNode(images) as plane:
        run_workload(plane, images["base"])
    assert differences(before, snapshot(SYSCTLS)) == []
