"""Run a local ``restate-server`` on loopback, and ask its admin API things.

Used by ``tether dev``, ``tether.testing`` and the tests: the server (found or installed by
``restate_install``) starts with random ports, a private data directory, telemetry off and a
request-identity key of its own; ``register``, ``unregister``, ``deployments`` and ``query``
send the admin calls of ``restate_admin`` with the standard library (retrying a busy server), so
this module imports without the ``restate`` extra.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import TetherError
from . import restate_admin
from .lifecycle import Lifecycle
from .local_http import request
from .process_group import stop_group
from .restate_admin import AdminCall, AdminRefused, parse_body, retry_delay
from .restate_identity import PRIVATE_KEY_ENV, public_key_of, write_private_key
from .restate_install import DEFAULT_RESTATE_VERSION, find_or_install_restate_server

__all__ = ["RestatePorts", "RestateServer", "RestateServerError", "free_port"]

IDENTITY_KEY_FILE = "request-identity.pem"
"""In the data directory: the private key the server signs its requests to deployments with."""

START_MARKER = "=== starting restate-server at "
"""Begins the line the log gets at every start of the server (its output follows)."""

EAGER_STATE_LIMIT = "64 KiB"
"""Restate sends an invocation of a virtual object all of the object's state up front (eager
state), unless it is over this size: then only part of it, and the handler asks for the rest as
it reads it. A long session's object holds megabytes (its turns, run records and events) while
a run reads a few keys of it; sent whole, it made a run on a 5,000-turn session start 3-4x
slower than on a 12-turn one (`bench/long_sessions.py`). The Helm chart sets the same
(`restate.eagerStateLimit`)."""
STREAMS_PER_CONNECTION = 16
"""Invocations Restate multiplexes on one HTTP/2 connection to a deployment (its default: 128).
A Kubernetes Service balances connections, not streams, so at 128 one of 2 replicas took every
run while fewer than ~90 ran (40 concurrent runs: 160 tool bodies to 0); at 16 Restate opens
another connection per ~11 running invocations and the pods share them (92 to 68; 8 spread
more, but cost a busy worker ~4% more CPU a turn). The Helm chart sets the same
(`restate.workerConnections.streamsPerConnection`; `tests/restate/test_worker_replicas.py`)."""
_SERVER_ENV_PREFIXES = ("RESTATE_",)
_SERVER_ENV_DROP = ("RUST_LOG", "RESTATE_CONFIG")
_NODE_IDENTITY_ENV = ("RESTATE_NODE_NAME", "RESTATE_CLUSTER_NAME", "RESTATE_AUTO_PROVISION")
_READY_QUERY = "SELECT id FROM sys_invocation LIMIT 1"


T = TypeVar("T")


class RestateServerError(TetherError, RuntimeError):
    """The server could not be started or stopped, or did not answer the admin API."""


def free_port() -> int:
    """A TCP port the kernel has free on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def config_variables(config: Mapping[str, Any], prefix: str = "RESTATE_") -> list[str]:
    """The environment variables that would set the settings of a configuration file (parsed
    TOML): ``advertised-address`` is ``RESTATE_ADVERTISED_ADDRESS``, ``addresses`` of the table
    ``[metadata-client]`` ``RESTATE_METADATA_CLIENT__ADDRESSES``."""
    names: list[str] = []
    for key, value in config.items():
        name = prefix + key.upper().replace("-", "_")
        if isinstance(value, Mapping):
            names += config_variables(value, name + "__")
        else:
            names.append(name)
    return names


# --------------------------------------------------------------------------------------------
# The server process
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RestatePorts:
    """The three TCP listeners of a single-node server."""

    ingress: int
    admin: int
    node: int

    @classmethod
    def random(cls) -> RestatePorts:
        ports: set[int] = set()
        while len(ports) < 3:
            ports.add(free_port())
        ingress, admin, node = sorted(ports)
        return cls(ingress=ingress, admin=admin, node=node)


class RestateServer(Lifecycle):
    """A single-node ``restate-server`` on 127.0.0.1.

    >>> with RestateServer() as server:          # doctest: +SKIP
    ...     deployment_id = server.register("http://127.0.0.1:9080")
    ...     rows = server.query("SELECT id, status FROM sys_invocation")

    ``extra_env`` adds or overrides server settings, e.g.
    ``{"RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT": "0s"}`` (suspend at every await) or
    ``{"RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL": "1s"}``. Inherited ``RESTATE_*`` variables
    are not passed through, so the server sees only this configuration.

    ``config_file`` is a configuration file (TOML) to start with, e.g. one the Helm chart gives a
    node of a cluster: its settings win over this class's (none of the variables it sets is
    passed), and only it names the node, its cluster and whether it provisions one (else
    Restate's defaults). The ports, data directory, memory and logs stay this class's where the
    file leaves them out.

    The data directory survives :meth:`stop` and :meth:`restart`; :meth:`close` (and leaving the
    ``with`` block) stops the server and deletes the directory if this object created it.

    The server signs its requests to deployments with a key of its own (made at the first start,
    kept in the data directory): give a worker :attr:`identity_public_key` to accept only them
    (``tether.programs.restate_identity``).
    """

    def __init__(
        self,
        binary: Path | None = None,
        *,
        version: str = DEFAULT_RESTATE_VERSION,
        base_dir: Path | None = None,
        ports: RestatePorts | None = None,
        extra_env: Mapping[str, str] | None = None,
        node_name: str = "tether-dev",
        startup_timeout: float = 60.0,
        stop_timeout: float = 30.0,
        config_file: Path | None = None,
    ) -> None:
        self._binary = binary
        self._version = version
        self._owns_base_dir = base_dir is None
        self._base_dir = base_dir
        self._fixed_ports = ports is not None
        self._ports = ports
        self._extra_env = dict(extra_env or {})
        self._node_name = node_name
        self._config_file = config_file
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._identity_public_key: str | None = None

    # -- properties --------------------------------------------------------------------------

    @property
    def ports(self) -> RestatePorts:
        if self._ports is None:
            raise RestateServerError("the server has not been started")
        return self._ports

    @property
    def ingress_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.ingress}"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.admin}"

    @property
    def node_url(self) -> str:
        """The node (message fabric) listener; it also serves ``/metrics`` and ``/health``."""
        return f"http://127.0.0.1:{self.ports.node}"

    @property
    def base_dir(self) -> Path:
        if self._base_dir is None:
            raise RestateServerError("the server has not been started")
        return self._base_dir

    @property
    def identity_public_key(self) -> str:
        """The ``publickeyv1_...`` key that verifies the server's requests to deployments."""
        if self._identity_public_key is None:
            raise RestateServerError("the server has not been started")
        return self._identity_public_key

    @property
    def log_path(self) -> Path:
        """Server stdout and stderr, appended across restarts."""
        return self.base_dir / "restate-server.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, max_chars: int = 4000) -> str:
        """The end of the server log (for error messages and failed tests)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(max(log.seek(0, os.SEEK_END) - max_chars, 0))
                return log.read().decode(errors="replace")
        except (OSError, RestateServerError):
            return ""

    # -- lifecycle ---------------------------------------------------------------------------

    def _environment(self, ports: RestatePorts, base_dir: Path) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(_SERVER_ENV_PREFIXES) and k not in _SERVER_ENV_DROP
        }
        env.update(
            {
                "RESTATE_DISABLE_TELEMETRY": "true",
                "DO_NOT_TRACK": "1",
                # The server asks api.github.com for its latest release at every start, and no
                # setting stops it (the chart resolves the name to the pod itself); here its
                # failure, an ERROR line in every log, is at least muted.
                "RESTATE_LOG_FILTER": "warn,restate=info,octocrab=off",
                "RESTATE_BASE_DIR": str(base_dir),
                "RESTATE_NODE_NAME": self._node_name,
                "RESTATE_CLUSTER_NAME": "tether-dev",
                "RESTATE_AUTO_PROVISION": "true",
                "RESTATE_LISTEN_MODE": "tcp",
                "RESTATE_BIND_ADDRESS": f"127.0.0.1:{ports.node}",
                "RESTATE_ADVERTISED_ADDRESS": f"http://127.0.0.1:{ports.node}/",
                "RESTATE_INGRESS__BIND_ADDRESS": f"127.0.0.1:{ports.ingress}",
                "RESTATE_INGRESS__ADVERTISED_INGRESS_ENDPOINT": f"http://127.0.0.1:{ports.ingress}/",
                "RESTATE_ADMIN__BIND_ADDRESS": f"127.0.0.1:{ports.admin}",
                "RESTATE_ADMIN__ADVERTISED_ADMIN_ENDPOINT": f"http://127.0.0.1:{ports.admin}/",
                "RESTATE_DEFAULT_NUM_PARTITIONS": "1",
                "RESTATE_ROCKSDB_TOTAL_MEMORY_SIZE": "256MiB",
                "RESTATE_SHUTDOWN_TIMEOUT": "10s",
                "RESTATE_LOG_FORMAT": "compact",
                "RESTATE_LOG_DISABLE_ANSI_CODES": "true",
                "RESTATE_WORKER__INVOKER__EAGER_STATE_SIZE_LIMIT": EAGER_STATE_LIMIT,
                "RESTATE_WORKER__INVOKER__HTTP2_STREAMS_PER_CONNECTION_LIMIT": str(
                    STREAMS_PER_CONNECTION
                ),
                # The invoker makes a temp dir per start (invoker-<ulid>) and never removes it.
                "TMPDIR": str(base_dir / "tmp"),
                PRIVATE_KEY_ENV: str(base_dir / IDENTITY_KEY_FILE),
            }
        )
        env.update(self._extra_env)
        if self._config_file is not None:
            config = tomllib.loads(self._config_file.read_text())
            for name in (*_NODE_IDENTITY_ENV, *config_variables(config)):
                env.pop(name, None)
            env["RESTATE_CONFIG"] = str(self._config_file)
        return env

    def start(self) -> None:
        """Start the server and wait until ingress and admin answer their health checks."""
        if self.is_running():
            return
        self._prepare()
        # A random port can be taken between probing and binding; retry with fresh ports unless
        # the caller fixed them (restarts keep the ports of the first start).
        attempts = 1 if (self._fixed_ports or self._ports is not None) else 3
        for attempt in range(attempts):
            if self._ports is None or attempt > 0:
                self._ports = RestatePorts.random()
            self._spawn()
            try:
                self.wait_ready()
                return
            except RestateServerError:
                exited = not self.is_running()
                in_use = "address already in use" in self.log_tail(20000).lower()
                self._terminate(grace=5.0)
                if not (exited and in_use) or attempt == attempts - 1:
                    raise

    def launch(self) -> None:
        """Start the process without waiting for it to be ready (:meth:`wait_ready`), on the
        ports of an earlier start (once they are free) or those given. The nodes of a cluster
        start this way, all at once: none is ready before its peers are up."""
        if self.is_running():
            return
        self._prepare()
        if self._ports is None:
            self._ports = RestatePorts.random()
        else:
            self._wait_ports_free(self._startup_timeout)
        self._spawn()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until ingress and admin answer their health checks and an introspection query
        succeeds (the partitions have leaders: invocations can be processed);
        `RestateServerError` if the process exits or ``timeout`` (default: the startup timeout)
        passes first."""
        self._wait_healthy(self._startup_timeout if timeout is None else timeout)

    def _prepare(self) -> None:
        if self._binary is None:
            self._binary = find_or_install_restate_server(self._version)
        if self._base_dir is None:
            self._base_dir = Path(tempfile.mkdtemp(prefix="tether-restate-"))

    def _spawn(self) -> None:
        assert self._binary is not None and self._base_dir is not None and self._ports is not None
        (self._base_dir / "tmp").mkdir(parents=True, exist_ok=True)
        key = Path(self._extra_env.get(PRIVATE_KEY_ENV) or self._base_dir / IDENTITY_KEY_FILE)
        if key.exists():
            self._identity_public_key = public_key_of(key.read_bytes())
        else:
            self._identity_public_key = write_private_key(key)
        with open(self.log_path, "ab") as log:
            log.write(f"\n{START_MARKER}{time.ctime()} ===\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                [str(self._binary), "--no-logo"],
                cwd=self._base_dir,
                env=self._environment(self._ports, self._base_dir),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        checks = [f"{self.ingress_url}/restate/health", f"{self.admin_url}/health"]
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc is not None else None
                raise RestateServerError(
                    f"restate-server exited with code {code} during start-up; log tail:\n"
                    f"{self.log_tail()}"
                )
            try:
                if all(request("GET", url, timeout=2.0).status == 200 for url in checks):
                    # Health turns green before the partition processor has a leader; until then
                    # queries fail with "node lookup for partition 0 failed". A query that
                    # succeeds means the partition is up and invocations can be processed.
                    probe = request(
                        "POST",
                        f"{self.admin_url}/query",
                        body=json.dumps({"query": _READY_QUERY}).encode(),
                        headers={"content-type": "application/json", "accept": "application/json"},
                        timeout=5.0,
                    )
                    if probe.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RestateServerError(
                    f"restate-server did not become healthy within {timeout:.0f}s; log tail:\n"
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)

    def _terminate(self, grace: float, sig: int = signal.SIGTERM) -> None:
        if self._proc is not None:
            stop_group(self._proc, grace=grace, sig=sig)
            self._proc = None

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL of the process group after ``timeout`` seconds."""
        self._terminate(self._stop_timeout if timeout is None else timeout)

    def kill(self) -> None:
        """SIGKILL the process group at once (a crash of the server: no SIGTERM first)."""
        self._terminate(0.0, signal.SIGKILL)

    def restart(self, *, graceful: bool = True) -> None:
        """Stop (SIGTERM, or SIGKILL if not ``graceful``) and start again, same ports and data."""
        if graceful:
            self.stop()
        else:
            self.kill()
        self._wait_ports_free(self._startup_timeout)
        self.start()

    def _wait_ports_free(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for port in (self.ports.ingress, self.ports.admin, self.ports.node):
            while True:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    try:
                        sock.bind(("127.0.0.1", port))
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise RestateServerError(f"port {port} is still in use") from None
                time.sleep(0.05)

    def close(self) -> None:
        """Stop the server and delete the data directory if this object created it."""
        self.stop()
        if self._owns_base_dir and self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
            self._base_dir = None

    # -- admin API ---------------------------------------------------------------------------

    def _admin(self, call: AdminCall[T], *, timeout: float = 60.0) -> T:
        """Send `call`, retrying a busy server (429, 503) and refused connections until
        ``timeout``; its value, or `AdminRefused`."""
        body = None if call.payload is None else json.dumps(call.payload).encode()
        headers = {"accept": "application/json"}
        if body is not None:
            headers["content-type"] = "application/json"
        url = f"{self.admin_url}{call.path}"
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            try:
                resp = request(call.method, url, body=body, headers=headers, timeout=timeout)
                wait = retry_delay(resp.status, resp.headers, delay)
                if wait is None:
                    return call.answer(resp.status, parse_body(resp.body))
                problem = f"HTTP {resp.status}: {resp.body[:500]!r}"
            except OSError as err:
                wait, problem = delay, repr(err)
            if time.monotonic() + wait > deadline:
                raise RestateServerError(f"{call.what} failed: {problem}")
            time.sleep(wait)
            delay = min(delay * 2, 2.0)

    def register(self, uri: str, *, timeout: float = 60.0) -> str:
        """Register the service endpoint at ``uri``; return its deployment id.

        The server discovers the endpoint over HTTP/2 with prior knowledge (h2c), so ``uri`` must
        be served by an HTTP/2-capable server such as hypercorn (an HTTP/1.1-only server fails
        with META0014). A ``uri`` registered before is discovered again and becomes the latest
        deployment. While the endpoint refuses connections (META0003: still starting)
        registration is retried until ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(deadline - time.monotonic(), 1.0)
            try:
                return self._admin(restate_admin.register(uri), timeout=remaining)
            except AdminRefused as refused:
                if refused.code != restate_admin.STILL_STARTING or time.monotonic() > deadline:
                    raise
            except RestateServerError as err:
                # The server retries discovery itself, so a dead endpoint can outlast `timeout`.
                raise RestateServerError(
                    f"registering {uri} failed within {timeout:.0f}s (is it listening, over "
                    f"HTTP/2?): {err}"
                ) from err
            time.sleep(0.2)

    def unregister(self, deployment_id: str) -> None:
        """Force-delete a deployment (an unknown one is already gone)."""
        self._admin(restate_admin.unregister(deployment_id))

    def deployments(self) -> list[dict[str, Any]]:
        """Every registered deployment, with its services."""
        return self._admin(restate_admin.deployments())

    def query(self, sql: str, *, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Run an introspection query (``POST /query``), e.g. on ``sys_invocation``."""
        return self._admin(restate_admin.query(sql), timeout=timeout)
