"""Real MCP servers for the tests: the pinned PyPI servers that `scripts/install-mcp-servers.sh`
installs, the `mcp-proxy` that puts a stdio server behind streamable HTTP, and the suite's own
server (`suite_server.py`), each as a real process.

- `install_mcp_servers()` runs the script (idempotent: milliseconds once installed) and returns
  each package's venv; `McpInstallError` carries the script's stderr.
- `StdioServer` describes a server to launch over stdio: `argv`, extra `env` (merged by the `mcp`
  SDK over its default environment: HOME, PATH, ...), `cwd`; `.params()` is the SDK's
  `StdioServerParameters`. `time_server`, `git_server`, `fetch_server` and `suite_stdio_server`
  build them.
- `HttpServerProcess` runs a streamable-HTTP server on a free loopback port in a process group of
  its own: started, polled until it answers, stopped with its whole group, and the port checked
  free. `mcp_proxy(...)` and `suite_http_server(...)` build them.
- `SuiteFiles` are the files through which a test steers the suite server and counts its calls.
- `serve_loopback_site()` is a one-page web site on 127.0.0.1 for `mcp-server-fetch`.

Nothing here imports the `mcp` SDK at module level except `StdioServer.params`, so a test module
can describe servers without it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.client.stdio import StdioServerParameters

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = REPO_ROOT / "scripts" / "install-mcp-servers.sh"
SUITE_SERVER = Path(__file__).resolve().with_name("suite_server.py")

LOOPBACK = "127.0.0.1"
PORT = "{port}"
"""In the argv of an `HttpServerProcess`: the port it listens on."""
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Probes go straight to loopback, whatever *_proxy variables say."""

POLL_INTERVAL = 0.02
"""Seconds between two readiness probes of a starting server (a probe, not a fixed wait)."""


# --------------------------------------------------------------------------------------------
# Installing the real servers
# --------------------------------------------------------------------------------------------


class McpInstallError(RuntimeError):
    """`scripts/install-mcp-servers.sh` failed; the message has its exit code and stderr."""


@dataclass(frozen=True)
class InstalledPackage:
    """One package's venv in the cache, as the install script reported it."""

    name: str
    version: str
    venv: Path

    def bin(self, program: str | None = None) -> Path:
        """An executable of the venv: the package's entry point by default."""
        return self.venv / "bin" / (program or self.name)


def install_mcp_servers(*packages: str, timeout: float = 1200.0) -> dict[str, InstalledPackage]:
    """Run the install script (all packages, or those named) and return what it installed."""
    try:
        done = subprocess.run(
            ["bash", str(INSTALL_SCRIPT), *packages],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise McpInstallError(f"{INSTALL_SCRIPT} did not finish in {timeout:.0f}s") from err
    if done.returncode != 0:
        raise McpInstallError(
            f"{INSTALL_SCRIPT} failed with exit code {done.returncode}:\n{done.stderr[-8000:]}"
        )
    installed: dict[str, InstalledPackage] = {}
    for line in done.stdout.splitlines():
        name, version, venv = line.split(" ", 2)
        installed[name] = InstalledPackage(name, version, Path(venv))
    missing = set(packages) - set(installed)
    if missing or not installed:
        raise McpInstallError(f"{INSTALL_SCRIPT} reported no venv for {sorted(missing)}")
    return installed


# --------------------------------------------------------------------------------------------
# Servers over stdio
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StdioServer:
    """How to launch an MCP server that speaks over its stdin/stdout."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra variables; the `mcp` SDK merges them over its default environment (HOME, PATH,
    LOGNAME, SHELL, TERM, USER), never the whole environment of the test."""
    cwd: Path | None = None

    @property
    def command(self) -> str:
        return self.argv[0]

    @property
    def args(self) -> list[str]:
        return list(self.argv[1:])

    def params(self) -> StdioServerParameters:
        """The `mcp` SDK's description, for `Client(server.params())`."""
        from mcp.client.stdio import StdioServerParameters

        return StdioServerParameters(
            command=self.command, args=self.args, env=dict(self.env) or None, cwd=self.cwd
        )


def time_server(packages: Mapping[str, InstalledPackage], timezone: str = "UTC") -> StdioServer:
    """`mcp-server-time` with a fixed local timezone (`get_current_time` without one uses it)."""
    exe = packages["mcp-server-time"].bin()
    return StdioServer("mcp-server-time", (str(exe), "--local-timezone", timezone))


def git_server(packages: Mapping[str, InstalledPackage], repository: Path) -> StdioServer:
    """`mcp-server-git` confined to `repository` (its tools take `repo_path`, which must be it)."""
    exe = packages["mcp-server-git"].bin()
    return StdioServer("mcp-server-git", (str(exe), "--repository", str(repository)))


def fetch_server(
    packages: Mapping[str, InstalledPackage], *, ignore_robots_txt: bool = True
) -> StdioServer:
    """`mcp-server-fetch` allowed to fetch loopback (it refuses private, loopback and link-local
    addresses, robots.txt included, without `--allow-private-ips`). Without `--ignore-robots-txt`
    it first GETs /robots.txt of the site (a 404 there allows everything)."""
    argv = [str(packages["mcp-server-fetch"].bin()), "--allow-private-ips"]
    if ignore_robots_txt:
        argv.append("--ignore-robots-txt")
    return StdioServer("mcp-server-fetch", tuple(argv))


# --------------------------------------------------------------------------------------------
# The suite's own server
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuiteFiles:
    """The files of one suite server (or of several sharing them): the calls log, the release
    file the slow tools wait for, and the marker that switches to version 2 of the tool list."""

    directory: Path
    block_timeout: float = 60.0

    @property
    def calls_log(self) -> Path:
        return self.directory / "calls.jsonl"

    @property
    def release_file(self) -> Path:
        return self.directory / "release"

    @property
    def tools_v2_marker(self) -> Path:
        return self.directory / "tools-v2"

    def args(self) -> list[str]:
        return [
            "--calls-log",
            str(self.calls_log),
            "--release",
            str(self.release_file),
            "--tools-v2-marker",
            str(self.tools_v2_marker),
            "--block-timeout",
            str(self.block_timeout),
        ]

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        """The calls whose body ran, oldest first: `{"tool", "arguments", "time", "pid",
        "idempotency_key"}`."""
        try:
            text = self.calls_log.read_text()
        except FileNotFoundError:
            return []
        # A line still being appended has no newline yet: only complete lines count.
        lines = text.split("\n")[:-1]
        records = [json.loads(line) for line in lines if line]
        return [r for r in records if tool is None or r["tool"] == tool]

    def count(self, tool: str) -> int:
        return len(self.calls(tool))

    def wait_for_calls(self, tool: str, count: int = 1, timeout: float = 30.0) -> None:
        """Poll the log until `tool`'s body has started `count` times (a slow tool is blocking
        then: the moment to kill the caller)."""
        deadline = time.monotonic() + timeout
        while self.count(tool) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{tool} ran {self.count(tool)} times, not {count}, within {timeout:g}s; "
                    f"calls: {self.calls()}"
                )
            time.sleep(POLL_INTERVAL)

    def release(self) -> None:
        """Let every blocked (and every later) slow call finish."""
        self.release_file.touch()

    def block(self) -> None:
        """Make slow calls block again."""
        self.release_file.unlink(missing_ok=True)

    def switch_tools(self, version: int = 2) -> None:
        """Serve version 2 of the tool list (`add` gone, `multiply` new), or 1 again."""
        if version == 2:
            self.tools_v2_marker.touch()
        else:
            self.tools_v2_marker.unlink(missing_ok=True)


def suite_stdio_server(files: SuiteFiles) -> StdioServer:
    """The suite server over stdio, run by this interpreter (which has the `mcp` SDK)."""
    return StdioServer(
        "tether-suite", (sys.executable, str(SUITE_SERVER), "--transport", "stdio", *files.args())
    )


# --------------------------------------------------------------------------------------------
# Servers over streamable HTTP
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port the kernel has free on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """Whether a server could listen on `port` now (SO_REUSEADDR, as uvicorn binds, so that
    connections left in TIME_WAIT do not count as a listener)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return False
            raise
        return True


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name: state, ppid, pgrp, ... (Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def pid_alive(pid: int) -> bool:
    """Whether `pid` is running (a zombie, waiting for a parent to reap it, is not)."""
    fields = _proc_stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def pgid_of(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return int(fields[2]) if fields is not None else None


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children, their children, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _proc_stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def signal_groups(groups: set[int], sig: int) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


class PortTakenError(RuntimeError):
    """The server could not listen on its port: another process had taken it."""


def listening_inodes(port: int) -> set[int]:
    """The inodes of the TCP sockets listening on `port` (any address), from /proc/net (Linux)."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                # local_address is ADDR:PORT in hex; state 0A is LISTEN; the inode is field 9.
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                    inodes.add(int(fields[9]))
    return inodes


class HttpServerProcess:
    """A server process that serves MCP over streamable HTTP at `url`, started in a session of
    its own, with its output in `log`. Ready once `GET ready_path` answers 200. `stop`/`kill`
    signal its process group and the groups of all its descendants (`mcp-proxy` starts its stdio
    server in a session of its own, and on SIGTERM exits without waiting for it)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        port: int | None = None,
        log: Path,
        mcp_path: str = "/mcp",
        ready_path: str,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 60.0,
        stop_grace: float = 3.0,
    ) -> None:
        self.name = name
        self.argv_template = list(argv)
        """The command; `{port}` in an argument stands for the port."""
        self._pick_port = port is None
        self.port = port if port is not None else free_port()
        self.log = log
        self.mcp_path = mcp_path
        self.ready_path = ready_path
        self.env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.stop_grace = stop_grace
        """Seconds `stop()` waits after SIGTERM before SIGKILL."""
        self.popen: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        self.startup_seconds: float | None = None
        """From spawning the process to the first 200 on `ready_path`."""

    @property
    def argv(self) -> list[str]:
        return [arg.replace(PORT, str(self.port)) for arg in self.argv_template]

    @property
    def base_url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        """The streamable-HTTP endpoint, for `mcp.Client(url)`."""
        return self.base_url + self.mcp_path

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was not started"
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, chars: int = 8000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self) -> HttpServerProcess:
        """Start the server and wait until it answers on its port. If the port, picked free, was
        taken by another process meanwhile, the first start tries another (at most 3 in all); a
        restart after `kill` keeps the port (and `url`)."""
        if self.alive():
            raise RuntimeError(f"{self.name} is already running")
        for attempt in range(3):
            try:
                return self._start()
            except PortTakenError:
                if not self._pick_port or self.startup_seconds is not None or attempt == 2:
                    raise  # a fixed port, or a restart: `url` must not change
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start(self) -> HttpServerProcess:
        started = time.monotonic()
        with open(self.log, "ab") as out:
            self._log_start = out.tell()
            out.write(f"\n=== {' '.join(self.argv)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_ready(started)
        except BaseException:
            # The port may be another process's: only this server's processes must be gone.
            self._stop(sig=signal.SIGTERM, grace=self.stop_grace, check_port=False)
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _wait_ready(self, started: float) -> None:
        url = self.base_url + self.ready_path
        while True:
            assert self.popen is not None
            if self.popen.poll() is not None:
                with open(self.log, "rb") as log:
                    log.seek(self._log_start)
                    this_start = log.read().decode(errors="replace")
                taken = "address already in use" in this_start.lower()
                raise (PortTakenError if taken else RuntimeError)(
                    f"{self.name} exited with {self.popen.returncode} before answering {url}; "
                    f"log:\n{self.log_tail()}"
                )
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                _NO_PROXY.open(url, timeout=2.0) as response,
            ):
                # The answer must come from this server, not from one that took the port first.
                if response.status == 200 and self._listens():
                    return
            if time.monotonic() - started > self.startup_timeout:
                raise TimeoutError(
                    f"{self.name} did not answer {url} within {self.startup_timeout:g}s; "
                    f"log:\n{self.log_tail()}"
                )
            time.sleep(POLL_INTERVAL)

    def _listens(self) -> bool:
        """Whether one of this server's processes holds the socket listening on its port."""
        inodes = listening_inodes(self.port)
        for pid in self.processes():
            with contextlib.suppress(OSError):
                for fd in Path(f"/proc/{pid}/fd").iterdir():
                    with contextlib.suppress(OSError):
                        link = os.readlink(fd)
                        if link.startswith("socket:[") and int(link[8:-1]) in inodes:
                            return True
        return False

    def processes(self) -> list[int]:
        """The live pids of the server: its leader and every descendant, in whatever group (the
        proxy launches its stdio server in a session of its own)."""
        if self.popen is None:
            return []
        return [pid for pid in [self.popen.pid, *descendants(self.popen.pid)] if pid_alive(pid)]

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the server's process groups (its own and its descendants') and wait until
        every process is gone: the server crashing, as far as a client can tell."""
        self._stop(sig=sig, grace=30.0)

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM the server's process groups; SIGKILL what is left after `grace` s (default
        `stop_grace`). Then every process must be gone and the port free."""
        self._stop(sig=signal.SIGTERM, grace=self.stop_grace if grace is None else grace)

    def _stop(self, *, sig: int, grace: float, check_port: bool = True) -> None:
        popen = self.popen
        if popen is None:
            return
        # Taken before signalling: a child the leader leaves behind is re-parented away from it.
        pids = [popen.pid, *descendants(popen.pid)]
        groups = {popen.pid} | {g for g in map(pgid_of, pids) if g is not None}
        signal_groups(groups, sig)
        deadline = time.monotonic() + grace
        while (popen.poll() is None or any(map(pid_alive, pids))) and time.monotonic() < deadline:
            time.sleep(POLL_INTERVAL)
        signal_groups(groups, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        popen.wait(timeout=10.0)
        deadline = time.monotonic() + 10.0
        while survivors := [pid for pid in pids if pid_alive(pid)]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: processes {survivors} survived SIGKILL")
            time.sleep(POLL_INTERVAL)
        self.popen = None
        deadline = time.monotonic() + 5.0
        while check_port and not port_is_free(self.port):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: port {self.port} still in use after it stopped")
            time.sleep(POLL_INTERVAL)

    def __enter__(self) -> HttpServerProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def mcp_proxy(
    packages: Mapping[str, InstalledPackage],
    server: StdioServer,
    *,
    log: Path,
    port: int | None = None,
    stateless: bool = False,
) -> HttpServerProcess:
    """`mcp-proxy` serving `server` (which it launches over stdio once, at its start, and shares
    among all HTTP clients) over streamable HTTP at /mcp (and SSE at /sse); ready once
    `GET /status` answers, which it does only after the stdio server has initialized. Not started.

    The stdio child gets the proxy's default environment (HOME, PATH, ...) plus `server.env`
    (`-e`), never the test's whole environment (no `--pass-environment`).
    """
    argv = [str(packages["mcp-proxy"].bin()), "--host", LOOPBACK, "--port", PORT]
    argv.append("--stateless" if stateless else "--no-stateless")
    for key, value in server.env.items():
        argv += ["-e", key, value]
    if server.cwd is not None:
        argv += ["--cwd", str(server.cwd)]
    argv += ["--", *server.argv]
    return HttpServerProcess(
        f"mcp-proxy({server.name})", argv, port=port, log=log, ready_path="/status"
    )


def suite_http_server(
    files: SuiteFiles, *, log: Path, port: int | None = None
) -> HttpServerProcess:
    """The suite server over streamable HTTP at /mcp (ready once `GET /health` answers). Not
    started. Restartable on the same port after `kill`: `start()` again."""
    argv = [sys.executable, str(SUITE_SERVER), "--transport", "http", "--port", PORT]
    argv += files.args()
    # uvicorn waits on SIGTERM for requests in flight, and a slow tool's may block for minutes:
    # a short grace, then SIGKILL (nothing of a test server is worth a graceful exit).
    return HttpServerProcess(
        "tether-suite", argv, port=port, log=log, ready_path="/health", stop_grace=0.5
    )


# --------------------------------------------------------------------------------------------
# A web site on loopback, for mcp-server-fetch
# --------------------------------------------------------------------------------------------

SITE_PAGE = """<!doctype html>
<html><head><title>Tether loopback page</title></head>
<body><article><h1>Tether loopback page</h1>
<p>The answer to the test is forty-two. This paragraph is long enough for an article.</p>
</article></body></html>
"""


@dataclass
class LoopbackSite:
    url: str
    """The page, http://127.0.0.1:<port>/page.html."""
    paths: list[str] = field(default_factory=list)
    """Every path asked for, in order (/robots.txt included)."""


@contextlib.contextmanager
def serve_loopback_site() -> Iterator[LoopbackSite]:
    """An HTTP server on 127.0.0.1 (in a thread) with one page, /page.html; anything else 404."""
    site = LoopbackSite("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            site.paths.append(self.path)
            if self.path != "/page.html":
                self.send_error(404)
                return
            body = SITE_PAGE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    site.url = f"http://{LOOPBACK}:{httpd.server_address[1]}/page.html"
    thread = threading.Thread(target=httpd.serve_forever, name="loopback-site", daemon=True)
    thread.start()
    try:
        yield site
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)
