"""Install and run a local ``restate-server`` (the npm build of the Restate server).

Used by the integration tests and by ``tether dev``: the server binary comes from the npm package
``@restatedev/restate-server`` (its per-platform optional dependency carries a static binary),
installed once into ``${TETHER_CACHE:-~/.cache/tether}/restate/<version>/`` and started on
loopback with random ports, a private data directory and telemetry off.

Only the standard library is used, so this module imports without the ``restate`` extra.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from ..errors import TetherError
from .process_group import stop_group
from .restate_identity import PRIVATE_KEY_ENV, public_key_of, write_private_key

__all__ = [
    "DEFAULT_RESTATE_VERSION",
    "RestatePorts",
    "RestateServer",
    "RestateServerError",
    "find_or_install_restate_server",
    "restate_cache_dir",
]

#: The pinned server version. Keep in sync with ``scripts/install-restate.sh``. restate-sdk 1.2
#: supports servers 1.3 to 1.7 (service protocol v5..v7).
DEFAULT_RESTATE_VERSION = "1.7.12"

#: Environment variable naming a ``restate-server`` binary to use instead of the npm install.
BINARY_ENV = "TETHER_RESTATE_SERVER"
IDENTITY_KEY_FILE = "request-identity.pem"
"""In the data directory: the private key the server signs its requests to deployments with."""

_NPM_PACKAGE = "@restatedev/restate-server"
_SERVER_ENV_PREFIXES = ("RESTATE_",)
_SERVER_ENV_DROP = ("RUST_LOG", "RESTATE_CONFIG")
_READY_QUERY = "SELECT id FROM sys_invocation LIMIT 1"


class RestateServerError(TetherError, RuntimeError):
    """The server could not be installed, started, stopped or asked something."""


# --------------------------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------------------------


def restate_cache_dir() -> Path:
    """``${TETHER_CACHE:-$HOME/.cache/tether}/restate``."""
    root = os.environ.get("TETHER_CACHE") or str(Path.home() / ".cache" / "tether")
    return Path(root).expanduser() / "restate"


def _platform_package() -> str:
    system = platform.system().lower()
    machine = platform.machine().lower()
    os_name = {"linux": "linux", "darwin": "darwin"}.get(system)
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if os_name is None or arch is None:
        raise RestateServerError(
            f"the npm package {_NPM_PACKAGE} has no binary for {system}/{machine}; "
            f"install restate-server yourself and set {BINARY_ENV} to its path"
        )
    return f"{_NPM_PACKAGE}-{os_name}-{arch}"


def _binary_in(prefix: Path) -> Path:
    return prefix / "node_modules" / _platform_package() / "bin" / "restate-server"


def _usable(binary: Path) -> bool:
    return binary.is_file() and os.access(binary, os.X_OK)


def _npm_install(npm: str, prefix: Path, spec: str) -> None:
    env = dict(os.environ)
    # The wrapper depends on @scarf/scarf, an install-analytics package. --ignore-scripts already
    # keeps its script from running; these make sure nothing else reports either.
    env.update({"SCARF_ANALYTICS": "false", "DO_NOT_TRACK": "1"})
    cmd = [
        npm,
        "install",
        "--ignore-scripts",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "--prefix",
        str(prefix),
        spec,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RestateServerError(
            f"`{' '.join(cmd)}` failed with exit code {proc.returncode}:\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
        )


def find_or_install_restate_server(
    version: str = DEFAULT_RESTATE_VERSION,
    *,
    cache_dir: Path | None = None,
    npm: str | None = None,
) -> Path:
    """Return the path of a ``restate-server`` binary of ``version``, installing it if needed.

    Order: ``$TETHER_RESTATE_SERVER`` if set; else the cached install under
    ``<cache_dir>/<version>/`` (``cache_dir`` defaults to :func:`restate_cache_dir`); else
    ``npm install --ignore-scripts`` of ``@restatedev/restate-server@<version>`` into that
    directory. The install goes to a temporary sibling directory that is renamed into place, under
    a file lock, so concurrent callers neither race nor see a half-installed tree.
    """
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override).expanduser()
        if not _usable(path):
            raise RestateServerError(f"{BINARY_ENV}={override} is not an executable file")
        return path

    root = cache_dir if cache_dir is not None else restate_cache_dir()
    target = root / version
    binary = _binary_in(target)
    if _usable(binary):
        return binary

    npm_cmd = npm or shutil.which("npm")
    if npm_cmd is None:
        raise RestateServerError(
            "npm was not found on PATH: install Node.js (with npm) to fetch restate-server, "
            f"or set {BINARY_ENV} to an existing restate-server binary"
        )

    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _usable(binary):  # installed by a concurrent caller while we waited for the lock
            return binary
        staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=root))
        staging.chmod(0o755)
        try:
            _npm_install(npm_cmd, staging, f"{_NPM_PACKAGE}@{version}")
            staged = _binary_in(staging)
            if not staged.is_file():
                # npm skips optional dependencies when configured to omit them; the platform
                # package carries the binary, so ask for it by name.
                _npm_install(npm_cmd, staging, f"{_platform_package()}@{version}")
            if not staged.is_file():
                raise RestateServerError(
                    f"npm installed {_NPM_PACKAGE}@{version} but {staged} is missing"
                )
            staged.chmod(staged.stat().st_mode | 0o111)
            out = subprocess.run(
                [str(staged), "--version"], capture_output=True, text=True, check=False
            )
            if out.returncode != 0 or version not in out.stdout:
                raise RestateServerError(
                    f"{staged} --version printed {out.stdout.strip()!r} (exit {out.returncode}), "
                    f"expected version {version}"
                )
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    if not _usable(binary):
        raise RestateServerError(f"restate-server was installed but {binary} is not executable")
    return binary


# --------------------------------------------------------------------------------------------
# HTTP helpers (stdlib; loopback only, proxies ignored)
# --------------------------------------------------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class _Response:
    status: int
    body: bytes
    headers: Mapping[str, str]

    def json(self) -> Any:
        return json.loads(self.body)


def _request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> _Response:
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return _Response(resp.status, resp.read(), dict(resp.headers.items()))
    except urllib.error.HTTPError as err:
        with err:
            return _Response(err.code, err.read(), dict(err.headers.items()))


def free_port() -> int:
    """A TCP port the kernel has free on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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


class RestateServer:
    """A single-node ``restate-server`` on 127.0.0.1.

    >>> with RestateServer() as server:          # doctest: +SKIP
    ...     deployment_id = server.register("http://127.0.0.1:9080")
    ...     rows = server.query("SELECT id, status FROM sys_invocation")

    ``extra_env`` adds or overrides server settings, e.g.
    ``{"RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT": "0s"}`` (suspend at every await) or
    ``{"RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL": "1s"}``. Inherited ``RESTATE_*`` variables
    are not passed through, so the server sees only this configuration.

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
    ) -> None:
        self._binary = binary
        self._version = version
        self._owns_base_dir = base_dir is None
        self._base_dir = base_dir
        self._fixed_ports = ports is not None
        self._ports = ports
        self._extra_env = dict(extra_env or {})
        self._node_name = node_name
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
                # The invoker makes a temp dir per start (invoker-<ulid>) and never removes it.
                "TMPDIR": str(base_dir / "tmp"),
                PRIVATE_KEY_ENV: str(base_dir / IDENTITY_KEY_FILE),
            }
        )
        env.update(self._extra_env)
        return env

    def start(self) -> None:
        """Start the server and wait until ingress and admin answer their health checks."""
        if self.is_running():
            return
        if self._binary is None:
            self._binary = find_or_install_restate_server(self._version)
        if self._base_dir is None:
            self._base_dir = Path(tempfile.mkdtemp(prefix="tether-restate-"))
        # A random port can be taken between probing and binding; retry with fresh ports unless
        # the caller fixed them (restarts keep the ports of the first start).
        attempts = 1 if (self._fixed_ports or self._ports is not None) else 3
        for attempt in range(attempts):
            if self._ports is None or attempt > 0:
                self._ports = RestatePorts.random()
            self._spawn()
            try:
                self._wait_healthy(self._startup_timeout)
                return
            except RestateServerError:
                exited = not self.is_running()
                in_use = "address already in use" in self.log_tail(20000).lower()
                self._terminate(grace=5.0)
                if not (exited and in_use) or attempt == attempts - 1:
                    raise

    def _spawn(self) -> None:
        assert self._binary is not None and self._base_dir is not None and self._ports is not None
        (self._base_dir / "tmp").mkdir(parents=True, exist_ok=True)
        key = Path(self._extra_env.get(PRIVATE_KEY_ENV) or self._base_dir / IDENTITY_KEY_FILE)
        if key.exists():
            self._identity_public_key = public_key_of(key.read_bytes())
        else:
            self._identity_public_key = write_private_key(key)
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== starting restate-server at {time.ctime()} ===\n".encode())
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
                if all(_request("GET", url, timeout=2.0).status == 200 for url in checks):
                    # Health turns green before the partition processor has a leader; until then
                    # queries fail with "node lookup for partition 0 failed". A query that
                    # succeeds means the partition is up and invocations can be processed.
                    probe = _request(
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

    def _terminate(self, grace: float) -> None:
        if self._proc is not None:
            stop_group(self._proc, grace=grace)
            self._proc = None

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM, then SIGKILL of the process group after ``timeout`` seconds."""
        self._terminate(self._stop_timeout if timeout is None else timeout)

    def kill(self) -> None:
        """SIGKILL the process group at once (a crash of the server)."""
        self._terminate(0.0)

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

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- admin API ---------------------------------------------------------------------------

    def _admin(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        timeout: float = 60.0,
        accept: str = "application/json",
    ) -> _Response:
        """Call the admin API, retrying 429/503 and refused connections until ``timeout``."""
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"accept": accept}
        if body is not None:
            headers["content-type"] = "application/json"
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            try:
                resp = _request(
                    method, f"{self.admin_url}{path}", body=body, headers=headers, timeout=timeout
                )
                if resp.status not in (429, 503):
                    return resp
                retry_after = resp.headers.get("retry-after") or resp.headers.get("Retry-After")
                wait = float(retry_after) if retry_after and retry_after.isdigit() else delay
                problem = f"HTTP {resp.status}: {resp.body[:500]!r}"
            except OSError as err:
                wait, problem = delay, repr(err)
            if time.monotonic() + wait > deadline:
                raise RestateServerError(f"admin {method} {path} failed: {problem}")
            time.sleep(wait)
            delay = min(delay * 2, 2.0)

    def register(self, uri: str, force: bool = True, *, timeout: float = 60.0) -> str:
        """Register the service endpoint at ``uri`` (``POST /deployments``); return its id.

        The server discovers the endpoint over HTTP/2 with prior knowledge (h2c), so ``uri`` must
        be served by an HTTP/2-capable server such as hypercorn (an HTTP/1.1-only server fails
        with META0014). ``force`` (the default here) re-discovers an already registered ``uri``
        and makes it the latest deployment. While the endpoint refuses connections (META0003:
        still starting) registration is retried until ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(deadline - time.monotonic(), 1.0)
            try:
                resp = self._admin(
                    "POST", "/deployments", {"uri": uri, "force": force}, timeout=remaining
                )
            except RestateServerError as err:
                # The server retries discovery itself, so a dead endpoint can outlast `timeout`.
                raise RestateServerError(
                    f"registering {uri} failed within {timeout:.0f}s (is it listening, over "
                    f"HTTP/2?): {err}"
                ) from err
            if resp.status in (200, 201):
                deployment_id: str = resp.json()["id"]
                return deployment_id
            text = resp.body.decode(errors="replace")
            if "META0003" not in text or time.monotonic() > deadline:
                raise RestateServerError(
                    f"registering {uri} failed: HTTP {resp.status}: {text[:2000]}"
                )
            time.sleep(0.2)

    def unregister(self, deployment_id: str) -> None:
        """Force-delete a deployment (``DELETE /deployments/{id}?force=true``)."""
        resp = self._admin("DELETE", f"/deployments/{deployment_id}?force=true")
        if resp.status not in (200, 202, 404):
            raise RestateServerError(
                f"deleting deployment {deployment_id} failed: HTTP {resp.status}: "
                f"{resp.body.decode(errors='replace')[:2000]}"
            )

    def query(self, sql: str, *, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Run an introspection query (``POST /query``), e.g. on ``sys_invocation``."""
        resp = self._admin("POST", "/query", {"query": sql}, timeout=timeout)
        if resp.status != 200:
            raise RestateServerError(
                f"query failed: HTTP {resp.status}: {resp.body.decode(errors='replace')[:2000]}"
            )
        rows: list[dict[str, Any]] = resp.json()["rows"]
        return rows

    def iter_deployments(self) -> Iterator[dict[str, Any]]:
        resp = self._admin("GET", "/deployments")
        if resp.status != 200:
            raise RestateServerError(f"listing deployments failed: HTTP {resp.status}")
        yield from resp.json()["deployments"]
