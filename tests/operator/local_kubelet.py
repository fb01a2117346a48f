"""A kubelet and kube-proxy for the worker container, on loopback.

kwok marks the pods of the operator's Deployments Ready without running anything. This helper
runs what the pod would run: for each version Deployment it starts the worker container's
command as a real process (for the agent's sidecar Deployment, its index container's), with the
container's environment (values from `secretKeyRef`s read from the Secrets, as the kubelet
does), the spec from the Deployment's ConfigMap, and listening on 127.0.0.1 at the node port of
its Service (the operator runs with
`TETHER_WORKER_SERVICE_TYPE=NodePort` and `TETHER_WORKER_URL_TEMPLATE=http://127.0.0.1:{node_port}`).
When the Deployment goes, the process goes.
"""

from __future__ import annotations

import base64
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from tests.operator.op_harness import Cluster
from tether.programs.process_group import GroupProcess

SPEC_PATH = "/etc/tether/agent.yaml"


class LocalKubelet:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.dir = Path(tempfile.mkdtemp(prefix="tether-kubelet-"))
        self.workers: dict[str, GroupProcess] = {}
        self.started: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="local-kubelet", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.sync()
            except Exception as error:  # keep polling: the API server answers again later
                sys.stderr.write(f"local kubelet: {error!r}\n")

    def sync(self) -> None:
        ns = self.cluster.namespace
        listed = self.cluster.apps.list_namespaced_deployment(
            ns, label_selector="app.kubernetes.io/managed-by=tether-operator"
        )
        wanted = {d.metadata.name: d for d in listed.items if d.metadata and d.metadata.name}
        for name in [n for n in self.workers if n not in wanted]:
            self.workers.pop(name).stop(grace=5)
        for name, deployment in wanted.items():
            if name not in self.workers:
                started = self._start(name, deployment)
                if started is not None:
                    self.workers[name] = started

    def _secret_value(self, ref: Any) -> str:
        secret = self.cluster.core.read_namespaced_secret(ref.name, self.cluster.namespace)
        return base64.b64decode((secret.data or {})[ref.key]).decode()

    def _start(self, name: str, deployment: Any) -> GroupProcess | None:
        ns = self.cluster.namespace
        service = self.cluster.core.read_namespaced_service(name, ns)
        config_map = self.cluster.core.read_namespaced_config_map(name, ns)
        ports = service.spec.ports if service.spec and service.spec.ports else []
        if not ports or not ports[0].node_port or not config_map.data:
            return None
        home = self.dir / name
        (home / "workspace").mkdir(parents=True, exist_ok=True)
        (home / "metrics").mkdir(exist_ok=True)
        spec = home / "agent.yaml"
        spec.write_text(config_map.data["agent.yaml"])
        # A version's `worker` container, or the sidecar's `index` (the sidecar itself is not
        # run: nothing here sends it webhooks).
        containers = deployment.spec.template.spec.containers
        worker = next(c for c in containers if c.command[:2] == ["tether", "worker"])
        env: dict[str, str] = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        for variable in worker.env or []:
            if variable.value_from is not None:
                env[variable.name] = self._secret_value(variable.value_from.secret_key_ref)
            else:
                env[variable.name] = variable.value or ""
        env.update(
            {
                "TETHER_SPEC": str(spec),
                "TETHER_WORKSPACE": str(home / "workspace"),
                "PROMETHEUS_MULTIPROC_DIR": str(home / "metrics"),
                "HOME": str(home),
                "PYTHONUNBUFFERED": "1",
            }
        )
        command = [*worker.command, *worker.args]
        assert command[:2] == ["tether", "worker"], command
        argv = [sys.executable, "-m", "tether", *command[1:]]
        argv = [str(spec) if part == SPEC_PATH else part for part in argv]
        argv[argv.index("--port") + 1] = str(ports[0].node_port)
        if "--metrics-port" in argv:  # one port per pod in a cluster, not on one host
            del argv[argv.index("--metrics-port") : argv.index("--metrics-port") + 2]
        argv += ["--host", "127.0.0.1"]
        self.started.append(name)
        return GroupProcess(argv, env=env, log=home / "worker.log", cwd=home)

    def logs(self) -> str:
        return "\n".join(
            f"----- worker {name} -----\n{process.log_tail()}"
            for name, process in self.workers.items()
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for process in self.workers.values():
            process.stop(grace=5)
        self.workers.clear()
        shutil.rmtree(self.dir, ignore_errors=True)  # the workers' specs, workspaces, logs
