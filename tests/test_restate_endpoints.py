"""Restate given as several nodes' URLs (`tether.programs.restate_endpoints`): a call whose
connection fails goes to the next node, for the sidecar's ingress calls and the operator's admin
calls alike; the settings of the sidecar, the worker and the operator take such lists."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tether.errors import ConfigError
from tether.programs import webhooks
from tether.programs.renewable_session import NO_ANSWER
from tether.programs.restate_endpoints import Endpoints, split_urls
from tether.programs.restate_server import free_port
from tether.programs.sidecar.restate_client import RestateClient
from tether.programs.sidecar.settings import SidecarConfigError
from tether.programs.sidecar.settings import settings_from_env as sidecar_settings
from tether.programs.worker.live import LivePublisher
from tether.programs.worker.settings import settings_from_env as worker_settings
from tether_operator.restate_admin import RestateAdmin
from tether_operator.settings import SettingsError
from tether_operator.settings import settings_from_env as operator_settings


def test_a_list_of_urls_is_split_and_checked() -> None:
    assert split_urls("http://a:8080/") == ("http://a:8080",)
    assert split_urls(" http://a:8080/, https://b:8080/x ,") == (
        "http://a:8080",
        "https://b:8080/x",
    )
    for bad in ("", " , ", "a:8080", "http://a:8080,b:8080"):
        with pytest.raises(ValueError):
            split_urls(bad)


async def test_a_failed_connection_moves_to_the_next_url_and_stays_there() -> None:
    endpoints = Endpoints("http://n1,http://n2,http://n3")
    down = {"http://n1", "http://n2"}
    tried: list[str] = []

    async def send(base: str) -> str:
        tried.append(base)
        if base in down:
            raise ConnectionRefusedError(base)
        return base

    assert await endpoints.call(send, (ConnectionRefusedError,)) == "http://n3"
    assert tried == ["http://n1", "http://n2", "http://n3"]
    tried.clear()
    down = {"http://n3"}  # the one that answered last is asked first, then the others in order
    assert await endpoints.call(send, (ConnectionRefusedError,)) == "http://n1"
    assert tried == ["http://n3", "http://n1"]
    down = {"http://n1", "http://n2", "http://n3"}
    with pytest.raises(ConnectionRefusedError, match="n3"):  # the last error, every node down
        await endpoints.call(send, (ConnectionRefusedError,))
    # An error that is not a failed connection (an answer) is not sent again.
    tried.clear()

    async def refuses(base: str) -> str:
        tried.append(base)
        raise ValueError("HTTP 400")

    with pytest.raises(ValueError):
        await endpoints.call(refuses, (ConnectionRefusedError,))
    assert len(tried) == 1


async def test_one_url_is_tried_twice() -> None:
    """Behind a Service, a second connection may reach another node."""
    endpoints = Endpoints("http://restate:8080")
    calls = 0

    async def send(base: str) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionResetError()
        return base

    assert await endpoints.call(send, (ConnectionResetError,)) == "http://restate:8080"
    assert calls == 2


@pytest.fixture
async def node() -> AsyncIterator[tuple[str, list[str]]]:
    """A live "node" answering like Restate's ingress and admin API; the paths it was sent."""
    url, seen, runner = await live_node()
    yield url, seen
    await runner.cleanup()


async def serving(
    handle: Callable[[web.Request], Awaitable[web.Response]],
) -> tuple[str, web.AppRunner]:
    """A local HTTP server answering every request with `handle`: its URL and its runner."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return f"http://127.0.0.1:{port}", runner


async def live_node() -> tuple[str, list[str], web.AppRunner]:
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        if request.path == "/restate/health":
            return web.json_response({"services": []})
        if request.path == "/deployments":
            return web.json_response({"deployments": [{"id": "dp_1"}]})
        return web.json_response({"invocationId": "inv_1", "status": "Accepted"}, status=202)

    url, runner = await serving(handle)
    return url, seen, runner


async def dropping_node() -> tuple[str, web.AppRunner]:
    """A "node" that closes every connection without answering (a node dying mid-request)."""

    async def handle(request: web.Request) -> web.Response:
        assert request.transport is not None
        request.transport.close()
        raise ConnectionResetError

    return await serving(handle)


async def test_the_sidecar_and_the_operator_reach_a_live_node(
    node: tuple[str, list[str]],
) -> None:
    live, seen = node
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: refused
    dropping, runner = await dropping_node()
    try:
        client = RestateClient(f"{dead},{dropping},{live}")
        sent = await client.send_run("clerk", "s1", b'{"prompt": "x"}', "key-1")
        assert sent == {"invocationId": "inv_1", "status": "Accepted"}
        assert await client.ingress_healthy()
        await client.close()
        assert seen == ["POST /clerk/s1/run/send", "GET /restate/health"]

        admin = RestateAdmin(f"{dropping}/,{dead}/,{live}/", timeout=10.0)
        assert await admin.deployments() == [{"id": "dp_1"}]
        await admin.close()
        assert seen[-1] == "GET /deployments"

        none_live = RestateClient(f"{dead},{dropping}")
        assert not await none_live.ingress_healthy()
        await none_live.close()
    finally:
        await runner.cleanup()


class Service:
    """A Kubernetes Service in front of two pods, at the TCP level: each new connection goes to
    the pod in service, and the connections made before `lose_pod()` go silent (their pod is
    gone without closing them: what is sent on them is lost, nothing comes back)."""

    def __init__(self, pods: list[str]) -> None:
        self.pods = [(url.split(":")[1][2:], int(url.split(":")[2])) for url in pods]
        self.serving = 0
        self.url = ""
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._connect, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    def lose_pod(self) -> None:
        self.serving += 1

    async def _connect(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        pod = self.serving
        upstream, to_pod = await asyncio.open_connection(*self.pods[pod])

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            while data := await source.read(65536):
                if self.serving == pod:
                    sink.write(data)
            sink.close()

        for source, sink in ((client, to_pod), (upstream, to_client)):
            task = asyncio.create_task(pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)


async def test_a_call_without_an_answer_goes_again_on_a_new_connection() -> None:
    """Behind a Service, the sidecar's pooled connections lead to a pod that is gone: the call
    that gets no answer on one is sent again on a new connection, which reaches the pod in
    service, and so are the calls after it (not on the other pooled ones, also silent)."""
    (lost, lost_saw, lost_runner), (live, live_saw, live_runner) = [
        await live_node() for _ in range(2)
    ]
    service = Service([lost, live])
    await service.start()
    client = RestateClient(service.url, aiohttp.ClientTimeout(total=2.0, sock_connect=2.0))
    try:
        # Two calls at once: two pooled connections to the first pod.
        await asyncio.gather(*(client.send_run("clerk", "s1", b"{}", f"k{i}") for i in (1, 2)))
        assert len(lost_saw) == 2
        service.lose_pod()
        sent = await client.send_run("clerk", "s1", b"{}", "k3")
        assert sent["status"] == "Accepted"
        assert (len(lost_saw), live_saw) == (2, ["POST /clerk/s1/run/send"])
        started = time.monotonic()
        await client.send_run("clerk", "s1", b"{}", "k4")
        assert time.monotonic() - started < 1.5, "a later call waited on a silent connection"
        assert len(live_saw) == 2
    finally:
        await client.close()
        await service.close()
        await lost_runner.cleanup()
        await live_runner.cleanup()


async def eventually(condition: Callable[[], bool], what: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        await asyncio.sleep(0.02)


async def test_the_worker_s_live_events_go_on_new_connections_after_a_post_without_answer() -> None:
    """Best effort: the batch posted on a silent connection is dropped (it may have arrived, so it
    is not sent again), and the next batch goes on a new connection, not the other silent one."""
    (lost, lost_saw, lost_runner), (live, live_saw, live_runner) = [
        await live_node() for _ in range(2)
    ]
    service = Service([lost, live])
    await service.start()
    publisher = LivePublisher("clerk", service.url, None, timeout=3.0)
    try:
        for session in ("s1", "s2"):  # one flush, two posts at once: two pooled connections
            publisher(session, 0, {"kind": "text_delta"})
        await eventually(lambda: len(lost_saw) == 2, "posts to the first pod")
        service.lose_pod()
        publisher("s3", 0, {"kind": "text_delta"})
        task = publisher._task
        assert task is not None
        await eventually(task.done, "the post on a silent connection dropped")
        publisher("s4", 0, {"kind": "text_delta"})
        # Sooner than the timeout a silent connection would take.
        await eventually(lambda: bool(live_saw), "a post to the pod in service", within=2.5)
        assert live_saw == ["POST /clerk-live/s4/push/send"] and len(lost_saw) == 2
    finally:
        await publisher.close()
        await service.close()
        await lost_runner.cleanup()
        await live_runner.cleanup()


async def test_a_worker_that_cannot_read_the_watched_sessions_sends_every_session_s() -> None:
    """An index that does not answer the watched set (one too old to serve it answers 404; this
    node answers 202): the worker sends every session's live events, as before the set."""
    url, seen, runner = await live_node()
    secret = b"k" * 32
    publisher = LivePublisher("clerk", url, secret, timeout=3.0, watch_secrets=(secret,))
    try:
        publisher("s1", 0, {"kind": "text_delta"})
        await eventually(lambda: len(seen) == 2, "the read of the set, then the post")
        assert seen == ["POST /clerk-watchers/all/watched", "POST /clerk-live/s1/push/send"]
    finally:
        await publisher.close()
        await runner.cleanup()


async def test_a_worker_asks_about_its_sessions_twice_a_second_not_at_each_one_s_turn() -> None:
    """Each question reads the whole watched set: a session asked about is asked about again
    only once its events have waited for a late client (`LATE_WATCHER_SECONDS`), and those
    questions come at most every `RECHECK_SECONDS`, for all the sessions at once, however their
    times fall; a new session is asked about at once."""
    asks: list[tuple[float, list[str]]] = []
    posts: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        if request.path.endswith("/watched"):
            asks.append((time.monotonic(), await request.json()))
            return web.json_response({})  # nobody watches
        posts.append(request.path)
        return web.json_response({}, status=202)

    url, runner = await serving(handle)
    secret = b"k" * 32
    publisher = LivePublisher("clerk", url, secret, timeout=3.0, watch_secrets=(secret,))
    sessions = [f"s{i}" for i in range(10)]
    first: dict[str, float] = {}
    try:
        started = time.monotonic()
        while (now := time.monotonic()) - started < 2.6:  # ten models streaming text
            for i, session in enumerate(sessions):
                if now - started >= 0.1 * i:  # one starting every 100 ms
                    first.setdefault(session, now)
                    publisher(session, 0, {"kind": "text_delta"})
            await asyncio.sleep(0.02)
        await eventually(lambda: not publisher._pending, "the pending events dropped")
        for session in sessions:
            tag = webhooks.watch_tags((secret,), session)[0]
            asked = min(at for at, tags in asks if tag in tags)
            assert asked - first[session] < 0.5, f"{session} waited for its first question"
        # Once all have started, their events wait a second from times 100 ms apart: the
        # questions that decide them come every ~0.5 s, not one for each session.
        later = [round(at - started, 2) for at, _ in asks if 1.1 <= at - started < 2.6]
        assert 2 <= len(later) <= 5, later
        assert posts == []
    finally:
        await publisher.close()
        await runner.cleanup()


def test_the_settings_take_a_cluster_s_nodes(tmp_path: Path) -> None:
    nodes = "http://n1:8080/, http://n2:8080"
    sidecar = sidecar_settings(
        {"RESTATE_INGRESS_URL": nodes, "TETHER_AGENT": "clerk", "TETHER_WEBHOOK_SECRET": "s" * 32}
    )
    assert sidecar.restate_ingress_url == "http://n1:8080,http://n2:8080"
    with pytest.raises(SidecarConfigError, match="or several separated by commas"):
        sidecar_settings(
            {
                "RESTATE_INGRESS_URL": "http://n1:8080,n2:8080",
                "TETHER_AGENT": "clerk",
                "TETHER_WEBHOOK_SECRET": "s" * 32,
            }
        )

    operator = operator_settings(
        {
            "TETHER_RESTATE_ADMIN_URL": "http://n1:9070/,http://n2:9070/",
            "TETHER_RESTATE_INGRESS_URL": nodes,
            "TETHER_WORKER_IMAGE": "tether:1",
        }
    )
    assert operator.restate_admin_url == "http://n1:9070,http://n2:9070"
    assert operator.restate_ingress_url == "http://n1:8080,http://n2:8080"
    assert operator.public_ingress_url == "http://n1:8080"  # what a status shows
    with pytest.raises(SettingsError, match="TETHER_RESTATE_ADMIN_URL must be"):
        operator_settings(
            {
                "TETHER_RESTATE_ADMIN_URL": "n1:9070",
                "TETHER_RESTATE_INGRESS_URL": nodes,
                "TETHER_WORKER_IMAGE": "tether:1",
            }
        )

    spec = tmp_path / "agent.yaml"
    spec.write_text(
        json.dumps(
            {
                "apiVersion": "tether.dev/v1alpha1",
                "kind": "DurableAgent",
                "metadata": {"name": "clerk"},
                "spec": {
                    "model": {"provider": "scripted", "name": "s", "script": [{"text": "hi"}]}
                },
            }
        )
    )
    worker = worker_settings({"TETHER_SPEC": str(spec), "RESTATE_INGRESS_URL": nodes})
    assert worker.ingress_url == "http://n1:8080,http://n2:8080"
    with pytest.raises(ConfigError, match="RESTATE_INGRESS_URL must be"):
        worker_settings({"TETHER_SPEC": str(spec), "RESTATE_INGRESS_URL": "n1:8080"})


def test_aiohttp_names_a_call_without_an_answer_as_the_endpoints_expect() -> None:
    """The errors the sidecar and the operator move on after are aiohttp's connection errors
    and its timeouts."""
    for error in (
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientConnectorError,
        aiohttp.ConnectionTimeoutError,
        aiohttp.SocketTimeoutError,
        asyncio.TimeoutError,
    ):
        assert issubclass(error, NO_ANSWER)
