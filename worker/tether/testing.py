"""Test your agents against a real ``restate-server``, as ``kopf.testing`` does for operators.

Two context managers, each a real server on loopback (random ports, a temporary data directory,
telemetry off; the binary found or installed like ``tether.programs.restate_server`` does) that they
stop at exit, process groups and temporary directories included:

- :class:`RestateHarness` serves your own Restate services (``tether.restate`` embedded in your
  handlers) or any ASGI app with hypercorn over HTTP/2 and registers them. Services and ASGI
  callables run in a thread of the test process, so a test sees what their tools did (and mocks
  work); a ``"module:attr"`` string runs in a hypercorn process of its own that a crash test
  can SIGKILL (:class:`HypercornWorker`).
- :class:`AgentHarness` serves a ``DurableAgent`` manifest as ``tether worker`` does, with the
  sidecar next to it (``tether.programs.dev.DevStack``): start runs, list the calls parked for a
  person, answer them with signed webhooks, read the session.

And :func:`crash_test` (``tether crashtest``): the agent's run on the embedded SQLite runtime,
SIGKILLed after every commit of its journal and inside every tool call, each time resumed and
compared with a clean run; a :class:`CrashReport` says which kill points failed and why::

    def test_every_crash_is_survived(tmp_path):
        report = crash_test("agent.yaml", "ship it", workspace=tmp_path, approve=True)
        assert not report.failed, report.describe()

And :class:`ServiceFront`, a port that routes to your worker's replicas as a Kubernetes Service
does, a dead replica's address refusing, to test how soon a run is back after its worker dies.

As a pytest plugin (``pytest_plugins = ["tether.testing"]`` in your ``conftest.py``) it gives
the fixtures ``tether_restate`` (a :class:`RestateHarness` on one server per test session; what a
test served is stopped and unregistered after it) and ``tether_agent`` (a factory:
``tether_agent("agent.yaml")`` starts an :class:`AgentHarness` stopped after the test)::

    def test_approval(tether_agent):
        agent = tether_agent("agent.yaml")
        invocation = agent.start_run("s1", "ship it")
        [call] = agent.parked(at_least=1)
        agent.approve(call)
        assert agent.result(invocation)["status"] == "completed"
        assert agent.session("s1").runs[-1].status == "completed"

When a test fails, the fixtures print the end of the logs (server, worker, sidecar) before they
remove them. (PYTEST_DONT_REWRITE: nothing here asserts for a test, so a test module may import
this module before pytest loads it as a plugin.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar, cast
from urllib.parse import quote

import yaml

from .errors import TetherError
from .parked import ParkedCall
from .programs.crashtest import CrashReport, CrashtestError, crash_test
from .programs.dev import DevStack
from .programs.lifecycle import Lifecycle
from .programs.local_http import Response, request
from .programs.process_group import signal_group
from .programs.restate_server import RestateServer, free_port
from .programs.webhooks import sign_request
from .session.types import SessionRecord

try:
    import pytest
except ImportError:  # the context managers work without pytest; the fixtures need it
    pytest = None  # type: ignore[assignment]

__all__ = [
    "ALWAYS_SUSPEND_ENV",
    "FAST_RETRY_ENV",
    "AgentHarness",
    "CrashReport",
    "CrashtestError",
    "HarnessError",
    "HypercornWorker",
    "RestateHarness",
    "Served",
    "ServiceFront",
    "crash_test",
    "group_alive",
    "wait_until",
]

T = TypeVar("T")

#: Retry a failed attempt after at most 2 s (default policy: 500 ms doubling up to 60 s), so a
#: replaced worker is picked up quickly even when it took a while to start.
FAST_RETRY_ENV = {"RESTATE_DEFAULT_RETRY_POLICY__MAX_INTERVAL": "2s"}

#: Suspend at every await: each journal completion ends the attempt and the next one replays
#: (finds code that does not replay the same way).
ALWAYS_SUSPEND_ENV = {"RESTATE_WORKER__INVOKER__INACTIVITY_TIMEOUT": "0s"}


class HarnessError(TetherError, RuntimeError):
    """A request of the harness got an answer it did not expect (its status and body)."""

    def __init__(self, what: str, status: int, body: bytes) -> None:
        self.status = status
        self.body = body.decode(errors="replace")
        super().__init__(f"{what}: HTTP {status}: {self.body[:2000]}")


def wait_until(
    predicate: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    interval: float = 0.05,
    what: str = "condition",
    retrying: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError),
) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned) or ``timeout`` passes. An
    error of ``retrying`` (a server not up yet) counts as "not yet", and is named on timeout."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except retrying as err:
            last_error = err
        if time.monotonic() > deadline:
            suffix = f" (last error: {last_error!r})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{suffix}")
        time.sleep(interval)


def _json(response: Response, what: str, *expected: int) -> Any:
    if response.status not in expected:
        raise HarnessError(what, response.status, response.body)
    return response.json() if response.body else None


def _post_json(url: str, payload: Any, headers: Mapping[str, str], timeout: float) -> Response:
    """POST ``payload`` as JSON (None: no body, for a handler without input)."""
    all_headers = {"accept": "application/json", **headers}
    body = None
    if payload is not None:
        body = json.dumps(payload).encode()
        all_headers["content-type"] = "application/json"
    return request("POST", url, body=body, headers=all_headers, timeout=timeout)


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, read from /proc (Linux)."""
    members: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` is still running."""
    if Path("/proc/self/stat").exists():
        return bool(_group_members(pgid))
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


_HYPERCORN_CONFIG = """\
bind = ["127.0.0.1:{port}"]
workers = 1
h2_max_concurrent_streams = 2147483647
keep_alive_max_requests = 2147483647
keep_alive_timeout = 2147483647
graceful_timeout = 5
"""


class HypercornWorker(Lifecycle):
    """``python -m hypercorn <app>`` on 127.0.0.1:<port> (h2c and HTTP/1.1 on one port).

    ``app`` is ``module:attr`` or ``/path/to/file.py:attr`` of a Restate app (ready once it
    answers ``GET /health``). The hypercorn CLI runs the app in a child process, so the worker
    runs in a session of its own (``start_new_session=True``) and :meth:`kill` signals the whole
    group: a SIGKILL of the parent alone would leave the child serving.
    """

    def __init__(
        self,
        app: str,
        *,
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        startup_timeout: float = 60.0,
        command: Sequence[str] | None = None,
    ) -> None:
        self.app = app
        self._command = list(command) if command else None
        """Run this instead (`{port}` is replaced), e.g. the `tether worker` CLI."""
        self.port = port if port is not None else free_port()
        self._env = dict(env or {})
        self._tmp = Path(tempfile.mkdtemp(prefix="tether-worker-")) if log_dir is None else None
        self._dir = log_dir if log_dir is not None else self._tmp
        assert self._dir is not None
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def returncode(self) -> int | None:
        """The exit code of the hypercorn parent process, None while it runs."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def log_path(self) -> Path:
        assert self._dir is not None
        return self._dir / f"hypercorn-{self.port}.log"

    def log_tail(self, max_chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""

    def start(self) -> None:
        assert self._dir is not None
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("worker already running")
        config = self._dir / f"hypercorn-{self.port}.toml"
        config.write_text(_HYPERCORN_CONFIG.format(port=self.port))
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self._env}
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== start {self.starts} at {time.ctime()} ===\n".encode())
            log.flush()
            default = [sys.executable, "-m", "hypercorn", "--config", str(config), self.app]
            command = [c.format(port=self.port) for c in self._command or []] or default
            self._proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        self._wait_listening()

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + self._startup_timeout
        while True:
            if self._proc is None or self._proc.poll() is not None:
                code = None if self._proc is None else self._proc.returncode
                raise RuntimeError(
                    f"hypercorn exited with {code} before listening; log:\n{self.log_tail()}"
                )
            # The SDK app answers GET /health once the worker child has imported the module.
            with contextlib.suppress(OSError):
                if request("GET", f"{self.url}/health", timeout=2.0).status == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"hypercorn on port {self.port} not ready after {self._startup_timeout:.0f}s; "
                    f"log:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def kill(self, sig: signal.Signals = signal.SIGKILL, *, timeout: float = 60.0) -> None:
        """Send ``sig`` to the whole process group and wait until every member has exited."""
        proc = self._proc
        if proc is None:
            return
        pgid = proc.pid  # session leader: pgid == pid
        signal_group(proc, sig)
        deadline = time.monotonic() + timeout
        while proc.poll() is None or group_alive(pgid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"process group {pgid} still alive {timeout:.0f}s after {sig!r}")
            time.sleep(0.02)
        self._proc = None

    def terminate(self) -> None:
        """SIGTERM the leader alone, as the kubelet stops a pod's PID 1, and return at once:
        the worker drains (:meth:`returncode` tells when it has exited)."""
        if self._proc is not None:
            self._proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL it if it has not exited after 15 s."""
        proc = self._proc
        if proc is None:
            return
        try:
            self.kill(signal.SIGTERM, timeout=15.0)
        except TimeoutError:
            self._proc = proc
            self.kill(signal.SIGKILL)

    def restart(self) -> None:
        """A fresh worker on the same port (the old one must have been killed)."""
        self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


class ServiceFront(Lifecycle):
    """A loopback port in front of a worker's replicas that routes as a Kubernetes Service does:
    each new connection goes to the port ``route()`` returns (kube-proxy picks an endpoint per
    connection) and is reset when it returns None or nothing listens there, as the address of a
    pod whose container is down answers. Register its :attr:`url` instead of the replicas' to
    test how soon a run is back after its worker dies (``route`` runs on the front's thread)::

        with ServiceFront(lambda: random.choice([a.port, b.port])) as front:
            server.register(front.url)
    """

    def __init__(self, route: Callable[[], int | None], port: int | None = None) -> None:
        self.route = route
        self.port = port if port is not None else free_port()
        self._carried: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"tether-front-{self.port}", daemon=True
        )
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        listen = asyncio.start_server(self._connect, "127.0.0.1", self.port)
        self._server = asyncio.run_coroutine_threadsafe(listen, self._loop).result(30)

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
        self._loop.close()

    def cut(self) -> None:
        """Reset every connection open through the front, both ways, as a lost network path
        (or a Restate node gone) cuts them: each side sees its streams end, and Restate's next
        connections are routed again."""

        async def reset() -> None:
            for writer in list(self._carried):
                _reset(writer)

        asyncio.run_coroutine_threadsafe(reset(), self._loop).result(30)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self.route()
        try:
            if port is None:
                raise ConnectionRefusedError
            upstream = await asyncio.open_connection("127.0.0.1", port)
        except OSError:  # reset, not closed: what a port nobody listens on answers
            _reset(writer)
            return
        ends = (writer, upstream[1])
        self._carried.update(ends)
        try:
            await asyncio.gather(
                _copy(reader, upstream[1]), _copy(upstream[0], writer), return_exceptions=True
            )
        except asyncio.CancelledError:
            pass  # the front closes: asyncio would log the connection's task as failed
        finally:
            self._carried.difference_update(ends)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    finally:  # one side gone: the other goes too, as a dead peer's connection does
        sink.transport.abort()


class _ThreadServer:
    """An ASGI app served by hypercorn (h2c and HTTP/1.1) in a thread with its own event loop."""

    def __init__(self, app: Any) -> None:
        self.app = app
        # Bound here, not picked free and bound later: nothing else can take the port between.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        self.port: int = listener.getsockname()[1]
        self._fd: int | None = listener.detach()  # hypercorn's once it serves
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main, name=f"tether-testing-{self.port}", daemon=True
        )

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported by start()
            self._error = error

    async def _serve(self) -> None:
        from hypercorn.asyncio import serve
        from hypercorn.config import Config

        config = Config()
        config.bind = [f"fd://{self._fd}"]
        self._fd = None
        config.h2_max_concurrent_streams = 2147483647
        config.keep_alive_max_requests = 2147483647
        config.keep_alive_timeout = 2147483647
        config.graceful_timeout = 1.0
        config.errorlog = logging.getLogger("tether.testing")  # pytest shows it on failure
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        await serve(self.app, config, shutdown_trigger=self._stop.wait)

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while True:
            if not self._thread.is_alive():
                raise RuntimeError(f"serving on port {self.port} failed: {self._error!r}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on port {self.port} after {timeout:.0f}s")
            time.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> None:
        if self._thread.ident is None:  # never started: the listener is still ours
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            return
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the app on port {self.port} did not stop within {timeout:.0f}s")


# --------------------------------------------------------------------------------------------
# Your own services
# --------------------------------------------------------------------------------------------


@dataclass
class Served:
    """An app a :class:`RestateHarness` serves: where, its deployment, and how it runs."""

    url: str
    deployment_id: str
    worker: HypercornWorker | None
    """The hypercorn process of a ``"module:attr"`` app (``kill()``, ``restart()``); None for an
    app served in a thread of the test process."""
    _thread: _ThreadServer | None = None

    def close(self) -> None:
        if self._thread is not None:
            self._thread.stop()
        if self.worker is not None:
            self.worker.close()


class _StateSnapshot:
    """Enough of a virtual object's context for `RestateSessionStore.load`: state read once."""

    def __init__(self, key: str, state: dict[str, bytes]) -> None:
        self._key, self._state = key, state

    def key(self) -> str:
        return self._key

    async def get(self, name: str, serde: Any = None, type_hint: Any = None) -> bytes | None:
        return self._state.get(name)

    async def state_keys(self) -> list[str]:
        return list(self._state)


def _sql(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


class RestateHarness(Lifecycle):
    """A real restate-server on loopback and the apps it serves for a test.

    >>> with RestateHarness() as restate:                        # doctest: +SKIP
    ...     restate.serve([my_agent_object])
    ...     result = restate.call("MyAgent/session-1/run", {"prompt": "hi"})

    Without ``server`` it starts its own (``extra_env`` over :data:`FAST_RETRY_ENV`;
    ``always_suspend=True`` adds :data:`ALWAYS_SUSPEND_ENV`) and stops it at exit; with one it
    borrows it, and at exit stops only what it served and unregisters it.
    """

    def __init__(
        self,
        server: RestateServer | None = None,
        *,
        extra_env: Mapping[str, str] | None = None,
        always_suspend: bool = False,
    ) -> None:
        self._owns_server = server is None
        env = {**FAST_RETRY_ENV, **(ALWAYS_SUSPEND_ENV if always_suspend else {})}
        self.server = server or RestateServer(extra_env={**env, **(extra_env or {})})
        self.served: list[Served] = []

    @property
    def ingress_url(self) -> str:
        return self.server.ingress_url

    @property
    def admin_url(self) -> str:
        return self.server.admin_url

    def start(self) -> Self:
        if self._owns_server:
            self.server.start()
        return self

    def close(self) -> None:
        """Stop what was served (and unregister it from a borrowed server); stop an own server."""
        served, self.served = self.served, []
        errors: list[BaseException] = []
        for app in served:
            try:
                app.close()
                if not self._owns_server and self.server.is_running():
                    self.server.unregister(app.deployment_id)
            except Exception as error:  # keep stopping the rest
                errors.append(error)
        if self._owns_server:
            self.server.close()
        if errors:
            raise errors[0]

    # -- serving -----------------------------------------------------------------------------

    def serve(self, app: Any, *, env: Mapping[str, str] | None = None) -> Served:
        """Serve ``app`` with hypercorn (HTTP/2) on a free loopback port and register it.

        ``app`` is a Restate service (``restate.Service``, ``VirtualObject``, ``Workflow``) or a
        list of them, or an ASGI app (``restate.app(...)``, or your own app that mounts one):
        served in a thread of this process. Or ``"module:attr"`` (or ``"/path/file.py:attr"``)
        of a Restate app: served by the hypercorn CLI in a process group of its own, with
        ``env`` added to its environment, which ``Served.worker.kill()`` crashes and
        ``Served.worker.restart()`` replaces (same port, same deployment).
        """
        runner: HypercornWorker | _ThreadServer
        if isinstance(app, str):
            runner = HypercornWorker(app, env=env)
            served = Served(runner.url, "", runner)
        else:
            import restate

            from .programs.worker.lifespan import answering_lifespan

            kinds = (restate.Service, restate.VirtualObject, restate.Workflow)
            if isinstance(app, kinds):
                app = [app]
            if isinstance(app, list | tuple):
                app = answering_lifespan(restate.app(services=list(app)))
            runner = _ThreadServer(app)
            served = Served(f"http://127.0.0.1:{runner.port}", "", None, runner)
        try:
            runner.start()
            served.deployment_id = self.server.register(served.url)
        except BaseException:
            served.close()
            raise
        self.served.append(served)
        return served

    # -- the ingress -------------------------------------------------------------------------

    def call(self, target: str, payload: Any = None, *, timeout: float = 120.0) -> Any:
        """Call ``target`` (``Service/handler`` or ``Object/key/handler``) through the ingress
        and wait for its result (JSON); a :class:`HarnessError` for an error answer (a
        terminal error of the handler included)."""
        response = _post_json(f"{self.ingress_url}/{target}", payload, {}, timeout)
        return _json(response, f"calling {target}", 200)

    def send(self, target: str, payload: Any = None, *, idempotency_key: str | None = None) -> str:
        """Start ``target`` without waiting (``.../send``); its invocation id."""
        headers = {"idempotency-key": idempotency_key} if idempotency_key else {}
        response = _post_json(f"{self.ingress_url}/{target}/send", payload, headers, 30.0)
        invocation: str = _json(response, f"sending {target}", 200, 202)["invocationId"]
        return invocation

    def result(self, invocation_id: str, *, timeout: float = 120.0) -> Any:
        """Wait for the result of an invocation (``/restate/invocation/<id>/attach``)."""
        url = f"{self.ingress_url}/restate/invocation/{quote(invocation_id)}/attach"
        response = request("GET", url, headers={"accept": "application/json"}, timeout=timeout)
        return _json(response, f"the result of {invocation_id}", 200)

    def resolve_awakeable(self, awakeable_id: str, value: Any = None) -> None:
        """Complete an awakeable with ``value`` (JSON) through Restate's ingress."""
        url = f"{self.ingress_url}/restate/awakeables/{quote(awakeable_id)}/resolve"
        _json(_post_json(url, value, {}, 30.0), f"resolving {awakeable_id}", 200, 202)

    def reject_awakeable(self, awakeable_id: str, reason: str) -> None:
        """Fail an awakeable with ``reason`` through Restate's ingress."""
        url = f"{self.ingress_url}/restate/awakeables/{quote(awakeable_id)}/reject"
        headers = {"content-type": "text/plain"}
        response = request("POST", url, body=reason.encode(), headers=headers, timeout=30.0)
        _json(response, f"rejecting {awakeable_id}", 200, 202)

    # -- state -------------------------------------------------------------------------------

    def session(self, service: str, key: str) -> SessionRecord | None:
        """The session that ``restate_session_store`` (and so ``restate_runtime``) keeps in the
        state of the virtual object ``service`` under ``key``, read through the admin API; None
        when there is none. (``AgentHarness.session`` reads an agent's.)"""
        from .restate.session import RestateSessionStore

        rows = self.server.query(
            "SELECT key, value FROM state "  # `value`: the bytes, in hex
            f"WHERE service_name = {_sql(service)} AND service_key = {_sql(key)}"
        )
        state = {str(row["key"]): bytes.fromhex(str(row["value"])) for row in rows}
        store = RestateSessionStore(cast(Any, _StateSnapshot(key, state)), read_only=True)
        # The store awaits nothing real; a thread keeps this usable from an async test too.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, store.load(key)).result()


# --------------------------------------------------------------------------------------------
# A DurableAgent manifest, as `tether worker` serves it
# --------------------------------------------------------------------------------------------


class AgentHarness(Lifecycle):
    """A ``DurableAgent`` manifest served as ``tether worker`` serves it, with its sidecar, on a
    real restate-server (``tether.programs.dev.DevStack`` on loopback).

    ``manifest`` is a file (``python:`` tools next to it are importable) or the manifest as a
    mapping. ``workspace`` is the file tools' directory (default: a temporary directory); the
    webhook secret and the logs go to a temporary data directory, all removed at exit. The
    worker and the sidecar get this process's environment (model API keys included).
    """

    def __init__(
        self, manifest: str | Path | Mapping[str, Any], *, workspace: str | Path | None = None
    ) -> None:
        self._temp: list[Path] = []
        try:
            if isinstance(manifest, Mapping):
                directory = self._mkdtemp("tether-manifest-")
                spec = directory / f"{manifest['metadata']['name']}.yaml"
                spec.write_text(yaml.safe_dump(dict(manifest)))
            else:
                spec = Path(manifest)
            self.workspace = Path(workspace or self._mkdtemp("tether-workspace-")).resolve()
            self.stack = DevStack(spec, self._mkdtemp("tether-agent-"), workspace=self.workspace)
        except BaseException:
            self._remove_temp()
            raise
        self.agent = self.stack.agent
        self.restate = RestateHarness(self.stack.server)
        """The stack's server: call any handler, resolve awakeables, read state."""

    def _mkdtemp(self, prefix: str) -> Path:
        path = Path(tempfile.mkdtemp(prefix=prefix))
        self._temp.append(path)
        return path

    def _remove_temp(self) -> None:
        for path in self._temp:
            shutil.rmtree(path, ignore_errors=True)
        self._temp.clear()

    @property
    def secret(self) -> str:
        """The webhook secret the sidecar and the worker accept (`TETHER_WEBHOOK_SECRET` when
        set, else generated)."""
        return self.stack.secret

    @property
    def ingress_url(self) -> str:
        return self.stack.server.ingress_url

    @property
    def sidecar_url(self) -> str:
        return self.stack.sidecar_url

    def start(self) -> Self:
        self.stack.start()
        return self

    def close(self) -> None:
        try:
            self.stack.stop()
        finally:
            self._remove_temp()

    # -- runs --------------------------------------------------------------------------------

    def _target(self, session: str, handler: str) -> str:
        return f"{self.agent}/{quote(session, safe='')}/{handler}"

    def run(self, session: str, prompt: str | None = None, *, timeout: float = 120.0) -> Any:
        """Run the agent in ``session`` and wait for how the run ended (``status``, ``text``,
        ``turns``, ``tool_calls``, tokens, ``cost_usd``, ``error``)."""
        target = self._target(session, "run")
        return self.restate.call(target, {"prompt": prompt}, timeout=timeout)

    def start_run(
        self, session: str, prompt: str | None = None, *, idempotency_key: str | None = None
    ) -> str:
        """Start a run without waiting (it may park); its invocation id, for :meth:`result`."""
        target = self._target(session, "run")
        return self.restate.send(target, {"prompt": prompt}, idempotency_key=idempotency_key)

    def result(self, invocation_id: str, *, timeout: float = 120.0) -> Any:
        """Wait for how a started run ended (as :meth:`run` returns it)."""
        return self.restate.result(invocation_id, timeout=timeout)

    def session(self, session: str) -> SessionRecord | None:
        """The session's turns and runs, as the worker keeps them in Restate."""
        return self.restate.session(self.agent, session)

    def restart_worker(self) -> None:
        """SIGKILL the worker's process group and start a new worker (a crash and its
        replacement): runs go on from their journal, parked calls stay parked."""
        self.stack.worker.kill(signal.SIGKILL)
        self.stack.start_worker()

    # -- parked calls, through the sidecar ----------------------------------------------------

    def _signed(self, method: str, path: str, payload: Any = None) -> Response:
        body = b"" if payload is None else json.dumps(payload).encode()
        headers = sign_request(self.secret.encode(), body, path=path)
        if payload is not None:
            headers["content-type"] = "application/json"
        url = f"{self.sidecar_url}{path}"
        return request(method, url, body=body or None, headers=headers, timeout=30.0)

    def parked(self, at_least: int = 0, *, timeout: float = 60.0) -> list[ParkedCall]:
        """The calls parked for a person (approvals, ``ask_human``), as the sidecar lists them
        (``GET /v1/approvals``, signed); with ``at_least``, wait until there are that many."""

        def listed() -> list[ParkedCall]:
            calls: list[ParkedCall] = _json(
                self._signed("GET", "/v1/approvals"), "listing parked calls", 200
            )["parked"]
            return calls

        def enough() -> list[ParkedCall] | None:
            calls = listed()
            return calls if len(calls) >= at_least else None

        if at_least <= 0:
            return listed()
        return wait_until(enough, timeout=timeout, what=f"{at_least} parked call(s)")

    def answer(self, call: ParkedCall | str, value: Any) -> None:
        """Resolve a parked call (its record or awakeable id) with ``value``, as a signed
        webhook to the sidecar does (``tether resolve``): an ``ask_human`` answer, or an
        approval's ``{"approved": bool}``."""
        awakeable_id = call if isinstance(call, str) else call["awakeable_id"]
        path = f"/v1/awakeables/{awakeable_id}/resolve"
        _json(self._signed("POST", path, value), f"answering {awakeable_id}", 202)

    def approve(self, call: ParkedCall | str, *, approver: str | None = None) -> None:
        """Approve a parked call (signed webhook), naming ``approver`` if given."""
        value: dict[str, Any] = {"approved": True}
        if approver is not None:
            value["approver"] = approver
        self.answer(call, value)

    def reject(self, call: ParkedCall | str, reason: str) -> None:
        """Reject a parked call with ``reason`` (signed webhook): the tool is not run and the
        model reads why (``tether resolve --reject``)."""
        awakeable_id = call if isinstance(call, str) else call["awakeable_id"]
        path = f"/v1/awakeables/{awakeable_id}/reject"
        _json(self._signed("POST", path, {"reason": reason}), f"rejecting {awakeable_id}", 202)


# --------------------------------------------------------------------------------------------
# The pytest plugin: `pytest_plugins = ["tether.testing"]`
# --------------------------------------------------------------------------------------------

if pytest is not None:
    _FAILED = pytest.StashKey[bool]()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when == "call":
            item.stash[_FAILED] = report.failed
        return report

    def dump_logs_if_failed(
        request: pytest.FixtureRequest, logs: Mapping[str, Callable[[], str]]
    ) -> None:
        """In a fixture's teardown: if the test failed, print each log (title, and a function
        that reads it; read only then) to stderr, where pytest shows it with the failure."""
        if request.node.stash.get(_FAILED, False):
            for title, read in logs.items():
                sys.stderr.write(f"\n----- {title} -----\n{read()}\n")

    def _tail(path: Path, max_chars: int = 8000) -> str:
        try:
            return path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""

    @pytest.fixture(scope="session")
    def tether_restate_server() -> Iterator[RestateServer]:
        """One restate-server for the test session (retries at most 2 s apart)."""
        with RestateServer(extra_env=FAST_RETRY_ENV) as server:
            yield server

    @pytest.fixture
    def tether_restate(
        tether_restate_server: RestateServer, request: pytest.FixtureRequest
    ) -> Iterator[RestateHarness]:
        """A :class:`RestateHarness` on the session's server: what the test serves is stopped
        and unregistered after it."""
        with RestateHarness(tether_restate_server) as harness:
            yield harness
            logs = {"restate-server log": lambda: tether_restate_server.log_tail(8000)}
            for app in harness.served:
                if app.worker is not None:
                    logs[f"{app.worker.app} log"] = functools.partial(app.worker.log_tail, 8000)
            dump_logs_if_failed(request, logs)

    @pytest.fixture
    def tether_agent(
        tmp_path: Path, request: pytest.FixtureRequest
    ) -> Iterator[Callable[..., AgentHarness]]:
        """``tether_agent(manifest, workspace=None)``: start an :class:`AgentHarness` (its
        workspace: the test's ``tmp_path`` unless given), stopped after the test."""
        started: list[AgentHarness] = []

        def start(
            manifest: str | Path | Mapping[str, Any], *, workspace: str | Path | None = None
        ) -> AgentHarness:
            harness = AgentHarness(manifest, workspace=workspace or tmp_path)
            started.append(harness)
            return harness.__enter__()

        yield start
        for harness in started:
            stack = harness.stack
            logs = {
                f"{stack.agent}: restate-server log": functools.partial(stack.server.log_tail, 8000)
            }
            for process in (stack.worker, stack.sidecar):
                logs[f"{stack.agent}: {process.name} log"] = functools.partial(_tail, process.log)
            dump_logs_if_failed(request, logs)
            harness.close()
