"""Fixtures that run the real ``restate-server`` (npm build) and hypercorn workers on loopback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.restate.support import (
    ALWAYS_SUSPEND_ENV,
    FAST_RETRY_ENV,
    HypercornWorker,
    ServedApp,
    service_app,
)
from tether.programs.restate_install import find_or_install_restate_server
from tether.programs.restate_server import RestateServer
from tether.testing import dump_logs_if_failed


@pytest.fixture(scope="session")
def restate_binary() -> Path:
    """The pinned ``restate-server``, installed into the user cache on first use."""
    return find_or_install_restate_server()


@pytest.fixture(scope="session")
def restate_server(restate_binary: Path) -> Iterator[RestateServer]:
    """One server for the session: default settings (60 s inactivity timeout) but retries capped
    at 2 s apart."""
    with RestateServer(restate_binary, extra_env=FAST_RETRY_ENV) as server:
        yield server


@pytest.fixture(scope="session")
def restate_server_always_suspend(restate_binary: Path) -> Iterator[RestateServer]:
    """A second server whose invoker suspends the invocation at every await."""
    env = {**FAST_RETRY_ENV, **ALWAYS_SUSPEND_ENV}
    with RestateServer(restate_binary, extra_env=env) as server:
        yield server


@pytest.fixture
def new_restate_server(
    restate_binary: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., RestateServer]]:
    """Factory for private servers (for tests that restart or crash the server)."""
    servers: list[RestateServer] = []

    def make(extra_env: dict[str, str] | None = None) -> RestateServer:
        server = RestateServer(restate_binary, extra_env={**FAST_RETRY_ENV, **(extra_env or {})})
        servers.append(server)
        server.start()
        return server

    yield make
    for server in servers:
        title = f"restate-server log ({server.base_dir})"
        dump_logs_if_failed(request, {title: functools.partial(server.log_tail, 8000)})
        server.close()


@pytest.fixture
def serve_app(
    restate_server: RestateServer, request: pytest.FixtureRequest
) -> Iterator[Callable[..., ServedApp]]:
    """``serve_app("raw_steps", server=...)``: start ``tests/restate/services/<module>.py``'s
    ``app`` with the hypercorn CLI on a free port, register it, and clean both up afterwards."""
    served: list[ServedApp] = []

    def serve(module: str, *, server: RestateServer | None = None) -> ServedApp:
        target = server if server is not None else restate_server
        worker = HypercornWorker(service_app(module))
        worker.start()
        try:
            deployment_id = target.register(worker.url)
        except BaseException:
            worker.close()
            raise
        app = ServedApp(worker=worker, server=target, deployment_id=deployment_id)
        served.append(app)
        return app

    yield serve
    for app in served:
        title = f"worker log ({app.worker.url})"
        dump_logs_if_failed(request, {title: functools.partial(app.worker.log_tail, 8000)})
        app.worker.close()
        if app.server.is_running():
            try:
                app.server.unregister(app.deployment_id)
            except Exception as err:  # cleanup only; the server may be in a bad state
                sys.stderr.write(f"\n----- unregister failed -----\n{err!r}\n")
