"""`tether dev`: a local stack for one agent — a real restate-server, the worker and the sidecar.

Everything runs on loopback, in process groups of its own, and stops when the stack stops.
With `nodes` of 3 or more, Restate is a replicated cluster of that many restate-server nodes
(`RestateCluster`: replication 2, the first node provisioning it) instead of one: the worker is
registered through any live node, and the worker and the sidecar are given every node's ingress
(`RESTATE_INGRESS_URL`, comma-separated), which they try in turn when one's connection fails
(`tether.programs.restate_endpoints`): a node can be killed under a running stack.
The webhook secret is generated once and kept in the data directory, so `tether resolve` can
sign resolutions for the running stack. The spec's schedules are set on the stack's Restate once
the worker is registered, as the operator sets them on a cluster.

The agent's workspace is `TETHER_WORKSPACE`, else the current directory; the data directory
(the secret, the logs, the metrics) must be outside it, where the file tools cannot read the
secret that approves calls: by default it is in Tether's state directory
(`tether.programs.hardening.state_dir`). The restate-server gets nothing of the environment but its
own settings (none of the worker's secrets).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import httpx2

from ..errors import ConfigError
from ..spec import load_agent, restate_services
from .hardening import refuse_state_in_workspace, state_dir
from .lifecycle import Lifecycle
from .process_group import signal_group, stop_group
from .restate_cluster import RestateCluster
from .restate_identity import IDENTITY_KEYS_ENV
from .restate_install import find_or_install_restate_server
from .restate_server import RestatePorts, RestateServer, free_port
from .webhooks import schedule_order

SECRET_FILE = "webhook-secret"
CLUSTER_REPLICATION = 2
"""Copies of each partition's log and state in a `tether dev` cluster: one node can be lost."""


def webhook_secret(data_dir: Path) -> str:
    """The stack's webhook secret: `TETHER_WEBHOOK_SECRET`, or one generated and kept."""
    if os.environ.get("TETHER_WEBHOOK_SECRET"):
        return os.environ["TETHER_WEBHOOK_SECRET"]
    path = data_dir / SECRET_FILE
    if not path.exists():
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Created 0600 (never readable by others, not even for a moment), by one process only.
        with contextlib.suppress(FileExistsError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


_SERVER_KEEPS = frozenset({"PATH", "HOME", "LANG", "TZ", "TMPDIR", "DO_NOT_TRACK"})


class _RestateServer(RestateServer):
    """The stack's restate-server with its own settings (`RESTATE_*`) and nothing else of the
    environment: none of the secrets (webhook secret, model keys, notify URL) that the worker
    and the sidecar get, since the agent's `shell` could read them from its `/proc/<pid>/environ`
    (a program of ours makes itself non-dumpable; restate-server does not)."""

    def _environment(self, ports: RestatePorts, base_dir: Path) -> dict[str, str]:
        env = super()._environment(ports, base_dir)
        return {
            k: v for k, v in env.items() if k in _SERVER_KEEPS or k.startswith(("RESTATE_", "LC_"))
        }


@dataclass
class Process:
    """A child process in its own group, logging to a file."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.popen = subprocess.Popen(
                self.command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole group (hypercorn and uvicorn run the app in child processes)."""
        if self.popen is not None:
            stop_group(self.popen, grace=20, sig=sig)
            self.popen = None


def wait_for(url: str, what: str, process: Process, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.popen is not None and process.popen.poll() is not None:
            raise RuntimeError(f"the {what} exited; see {process.log}")
        with contextlib.suppress(httpx2.HTTPError):
            if httpx2.get(url, timeout=2).status_code < 500:
                return
        time.sleep(0.1)
    raise TimeoutError(
        f"the {what} did not answer at {url} within {timeout:.0f} s; see {process.log}"
    )


class DevStack(Lifecycle):
    """restate-server (or a cluster of them) + `tether worker` + `tether sidecar` for one
    DurableAgent manifest."""

    def __init__(
        self,
        spec: str | Path,
        data_dir: str | Path | None = None,
        *,
        workspace: str | Path | None = None,
        server_env: Mapping[str, str] | None = None,
        nodes: int = 1,
    ) -> None:
        """`workspace`: the file tools' directory (default: `TETHER_WORKSPACE`, else the
        current directory); `server_env`: restate-server settings (`RESTATE_*`) to add;
        `nodes`: 1, one restate-server, or 3 and more, a replicated cluster."""
        if nodes < 1 or nodes == 2:
            raise ConfigError(
                f"--nodes {nodes}: use 1 (one restate-server) or 3 or more (a replicated "
                "cluster; with 2 nodes, losing either one stops it)"
            )
        self.spec = Path(spec).resolve()
        self.agent = load_agent(self.spec).metadata.name
        where = workspace or os.environ.get("TETHER_WORKSPACE") or os.getcwd()
        self.workspace = Path(where).resolve()
        self.data_dir = Path(state_dir() / "dev" if data_dir is None else data_dir).resolve()
        # Before anything is written there: the secret file approves calls.
        refuse_state_in_workspace(self.data_dir, self.workspace, "the data dir", "--data-dir")
        self.secret = webhook_secret(self.data_dir)
        self.metrics_dir = self.data_dir / "metrics"
        self.worker_port = free_port()
        self.sidecar_port = free_port()
        binary = find_or_install_restate_server()
        self.cluster: RestateCluster | None = None
        self._server: RestateServer | None = None
        if nodes == 1:
            self._server = _RestateServer(binary, extra_env=server_env)
        else:
            self.cluster = RestateCluster(
                binary,
                size=nodes,
                replication=CLUSTER_REPLICATION,
                extra_env=server_env,
                cluster_name="tether-dev",
                server_class=_RestateServer,
            )
        env = {
            **os.environ,
            "TETHER_WEBHOOK_SECRET": self.secret,
            "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
        }
        tether = [sys.executable, "-m", "tether"]
        self.worker = Process(
            "worker",
            [
                *tether,
                "worker",
                "--spec",
                str(self.spec),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.worker_port),
            ],
            {
                **env,
                "TETHER_WEBHOOK_BASE_URL": self.sidecar_url,
                "TETHER_WORKSPACE": str(self.workspace),
            },
            self.data_dir / "worker.log",
        )
        self.sidecar = Process(
            "sidecar",
            [*tether, "sidecar", "--host", "127.0.0.1", "--port", str(self.sidecar_port)],
            {**env, "TETHER_AGENT": self.agent},
            self.data_dir / "sidecar.log",
        )

    @property
    def server(self) -> RestateServer:
        """The restate-server of a one-node stack."""
        if self._server is None:
            raise RuntimeError("a stack of several Restate nodes has no one server: see .cluster")
        return self._server

    @property
    def ingress_urls(self) -> list[str]:
        """Every node's ingress (one for a one-node stack), once started."""
        if self.cluster is not None:
            return [self.cluster.ingress_url(i) for i in range(len(self.cluster.nodes))]
        return [self.server.ingress_url]

    @property
    def ingress_url(self) -> str:
        """Restate's ingress as the worker and the sidecar take it (a cluster's: every node's,
        comma-separated)."""
        return ",".join(self.ingress_urls)

    @property
    def sidecar_url(self) -> str:
        return f"http://127.0.0.1:{self.sidecar_port}"

    @property
    def worker_url(self) -> str:
        return f"http://127.0.0.1:{self.worker_port}"

    def start(self) -> Self:
        if self.metrics_dir.exists():  # stale files from an earlier stack would be summed in
            for stale in self.metrics_dir.glob("*.db"):
                stale.unlink()
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        if self.cluster is not None:
            self.cluster.start()
            identity = self.cluster.identity_public_key  # every node signs with it
        else:
            self.server.start()
            identity = self.server.identity_public_key
        self.sidecar.env |= {
            "RESTATE_INGRESS_URL": self.ingress_url,
        }
        # The worker takes requests only from this server (tether.programs.restate_identity),
        # and sends the sessions' live events through its ingress.
        self.worker.env[IDENTITY_KEYS_ENV] = identity
        self.worker.env["RESTATE_INGRESS_URL"] = self.ingress_url
        self.start_worker()
        self.set_schedules()
        self.sidecar.start()
        wait_for(f"{self.sidecar_url}/healthz", "sidecar", self.sidecar)
        return self

    def set_schedules(self) -> None:
        """Set the spec's schedules on the stack's Restate, as the operator does on a cluster
        (`tether_operator.schedules`), as of a new owner: each stack starts with a Restate of
        its own."""
        owner = f"tether-dev-{secrets.token_hex(4)}"
        service = restate_services(self.agent).schedule
        for schedule in load_agent(self.spec).spec.schedules:
            config = schedule.model_dump(by_alias=True, mode="json")
            order = schedule_order(
                self.secret.encode(),
                schedule.name,
                config,
                owner=owner,
                generation=1,
                stamp=time.time(),
            )
            url = f"{self.ingress_urls[0]}/{service}/{schedule.name}/set"
            answer = httpx2.post(url, json=order, timeout=30)
            if answer.status_code != 200:
                raise ConfigError(f"setting the schedule {schedule.name!r} failed: {answer.text}")

    def start_worker(self) -> None:
        self.worker.start()
        wait_for(f"{self.worker_url}/health", "worker", self.worker)
        if self.cluster is not None:
            self.cluster.register(self.worker_url)  # through any live node
        else:
            self.server.register(self.worker_url)

    def stop(self) -> None:
        # Both are told at once, so stopping takes the longer of their shutdowns, not the sum.
        for process in (self.sidecar, self.worker):
            if process.popen is not None:
                signal_group(process.popen, signal.SIGTERM)
        self.sidecar.kill(signal.SIGTERM)
        self.worker.kill(signal.SIGTERM)
        if self.cluster is not None:
            self.cluster.close()
        else:
            self.server.close()

    close = stop

    def describe(self) -> str:
        first, *others = self.ingress_urls
        nodes = [f"  other nodes:  {', '.join(others)}  (any node's ingress will do)"]
        return "\n".join(
            [
                f"agent {self.agent} is up:",
                f"  start a run:  curl {first}/{self.agent}/<session>/run "
                "-H 'content-type: application/json' -d '{\"prompt\": \"...\"}'",
                f"  ingress:      {first}",
                *(nodes if others else []),
                f"  webhooks:     {self.sidecar_url}/v1/awakeables/<id>/resolve  "
                f"(parked calls: {self.sidecar_url}/v1/approvals)",
                f"  metrics:      {self.sidecar_url}/metrics",
                f"  resolve:      tether resolve <awakeable-id> --sidecar {self.sidecar_url}",
                f"  workspace:    {self.workspace}  (the file tools' directory)",
                f"  logs:         {self.data_dir}",
            ]
        )
