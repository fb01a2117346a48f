"""Two `tether worker` replicas behind a Kubernetes Service (`tether.testing.ServiceFront`).

- Runs spread over both: a Service balances connections, not requests, and Restate multiplexes
  its invocations on HTTP/2 connections, so at its default of 128 streams a connection one
  replica got every run while fewer than ~90 ran. The server here runs with the chart's
  setting (`tether.programs.restate_server.STREAMS_PER_CONNECTION`).
- A worker SIGKILLed mid-tool: its pod keeps its address among the Service's endpoints while its
  container restarts, so Restate's retries of the interrupted run land on it (refused) or on a
  live replica, at random per connection. Here the front refuses the next connections after the
  kill, as the dead pod's address would, then routes to the other replica: the run must be back
  within half a second, which only a retry policy with quick early attempts gives
  (`tether.programs.worker.retries`; at 100 ms doubling, three refusals cost 1.5 s).
- A replica that joins under steady load (a scale-out) gets runs: Restate keeps invoking over
  the connections it has open while they have free streams, so only a worker retiring its
  connections with age (`tether.programs.worker.connection_age`) sends new ones through the
  Service again.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.restate.support import attach, http, send_run, worker_process
from tests.restate.test_worker import manifest
from tether.programs.restate_server import RestateServer
from tether.programs.webhooks import pace_signature
from tether.programs.worker.pace import pace_ask
from tether.rate import Pace, Rate
from tether.testing import HypercornWorker, ServiceFront, wait_until

AGENT = "loss-agent"
REFUSED = 3
"""Connections refused after the kill: a 1-in-8 draw of a Service's coin flips between 2 pods."""
BACK_WITHIN = 0.5

TOOL = '''
import asyncio, os, time

from tether import tool


@tool
async def slow(n: int) -> str:
    """Works on step n for a while."""
    with open(os.environ["LOSS_STAMPS"], "a") as stamps:
        stamps.write("%d %s %.6f\\n" % (n, os.environ["LOSS_REPLICA"], time.time()))
    await asyncio.sleep(float(os.environ["LOSS_TOOL_SECONDS"]))
    return "step %d done" % n
'''


class Scripted:
    """A `ServiceFront`'s route: every connection to replica `a` until `cut()`, then the next
    `REFUSED` reset (the dead pod's address), the rest to `b`."""

    def __init__(self, a: int, b: int) -> None:
        self.ports = {"a": a, "b": b}
        self.cut_at: float | None = None
        self.refused_at: list[float] = []

    def cut(self) -> None:
        self.cut_at = time.time()

    def __call__(self) -> int | None:
        if self.cut_at is None:
            return self.ports["a"]
        if len(self.refused_at) < REFUSED:
            self.refused_at.append(time.time() - self.cut_at)
            return None
        return self.ports["b"]


@contextmanager
def serving(
    restate_server: RestateServer,
    directory: Path,
    tool_seconds: float,
    model: dict[str, Any] | None = None,
    **env: str,
) -> Iterator[dict[str, HypercornWorker]]:
    """Replicas `a` and `b` of one `tether worker`, on ports of their own; stopped at exit.
    `model` adds to the spec's model."""
    (directory / "loss_tools.py").write_text(TOOL)
    script = [
        {"text": f"step {n}", "tool_calls": [{"name": "slow", "input": {"n": n}}]} for n in range(3)
    ]
    tools = [{"name": "slow", "python": "loss_tools:slow", "replay": "safe"}]
    document = manifest(AGENT, [*script, {"text": "done"}], tools=tools)
    document["spec"]["model"].update(model or {})
    with ExitStack() as stack:
        workers: dict[str, HypercornWorker] = {}
        for name in ("a", "b"):
            worker = worker_process(
                restate_server,
                directory,
                document,
                LOSS_STAMPS=str(directory / "stamps"),
                LOSS_REPLICA=name,
                LOSS_TOOL_SECONDS=str(tool_seconds),
                **env,
            )
            workers[name] = stack.enter_context(worker)
        yield workers


@pytest.fixture
def replicas(restate_server: RestateServer, tmp_path: Path) -> Iterator[dict[str, HypercornWorker]]:
    with serving(restate_server, tmp_path, tool_seconds=2) as workers:
        yield workers


def stamps(path: Path) -> list[tuple[int, str, float]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(n), replica, float(at)) for n, replica, at in (line.split() for line in lines)]


def test_a_run_is_back_on_the_live_replica_soon_after_refusals_from_the_dead_ones_address(
    restate_server: RestateServer, replicas: dict[str, HypercornWorker], tmp_path: Path
) -> None:
    path = tmp_path / "stamps"
    route = Scripted(replicas["a"].port, replicas["b"].port)
    with ServiceFront(route) as front:
        restate_server.register(front.url)
        invocation = send_run(restate_server.ingress_url, AGENT, "s-loss", "go")
        wait_until(lambda: any(n == 1 for n, _, _ in stamps(path)), timeout=60, what="step 1")
        route.cut()
        replicas["a"].kill()
        again = wait_until(
            lambda: next((at for n, r, at in stamps(path) if n == 1 and r == "b"), None),
            timeout=30,
            what="step 1 again, on replica b",
        )
        result = attach(restate_server.ingress_url, invocation, timeout=60)
    assert result["status"] == "completed", result
    assert len(route.refused_at) == REFUSED, route.refused_at
    assert [(n, r) for n, r, _ in stamps(path)] == [(0, "a"), (1, "a"), (1, "b"), (2, "b")]
    assert route.cut_at is not None
    back = again - route.cut_at
    refused = [round(at, 3) for at in route.refused_at]
    assert back < BACK_WITHIN, f"back {back:.2f} s after the kill; refused at {refused} s"


def test_concurrent_runs_spread_over_the_replicas(
    restate_server: RestateServer, replicas: dict[str, HypercornWorker], tmp_path: Path
) -> None:
    ports = itertools.cycle([replicas["a"].port, replicas["b"].port])  # connections alternate
    with ServiceFront(lambda: next(ports)) as front:
        restate_server.register(front.url)
        runs = [send_run(restate_server.ingress_url, AGENT, f"s{i}", "go") for i in range(24)]
        results = [attach(restate_server.ingress_url, run, timeout=120) for run in runs]
    assert all(result["status"] == "completed" for result in results), results
    bodies = [replica for _, replica, _ in stamps(tmp_path / "stamps")]
    assert len(bodies) == 24 * 3
    shares = {replica: bodies.count(replica) / len(bodies) for replica in ("a", "b")}
    assert min(shares.values()) >= 0.25, shares


def failed_attempts(server: RestateServer) -> int:
    rows = server.query(
        "SELECT count(*) AS n FROM sys_journal_events WHERE event_type = 'TransientError'"
    )
    return int(rows[0]["n"])


def cut_responses(server: RestateServer) -> int:
    """Responses whose end never came: Restate gives up on them after 5 s, and logs it."""
    return server.log_path.read_text(errors="replace").count("Response stream draining timeout")


def test_a_replica_that_joins_under_steady_load_gets_runs(
    restate_server: RestateServer, tmp_path: Path
) -> None:
    """A Service's new pod (a scale-out) under steady load: Restate puts each invocation on an
    open connection with a free stream, so without connections that retire with age
    (`tether.programs.worker.connection_age`) replica b gets nothing. None is cut off either:
    every run completes, every tool body runs once and no attempt fails."""
    path = tmp_path / "stamps"
    joined = threading.Event()
    stop = threading.Event()
    results: list[dict[str, str]] = []
    max_age = {"TETHER_WORKER_CONNECTION_MAX_AGE": "1"}
    failed_before = failed_attempts(restate_server)  # the server is the module's
    cut_before = cut_responses(restate_server)
    with serving(restate_server, tmp_path, tool_seconds=0.1, **max_age) as replicas:
        ports = itertools.cycle([replicas["a"].port, replicas["b"].port])
        with ServiceFront(lambda: next(ports) if joined.is_set() else replicas["a"].port) as front:
            restate_server.register(front.url)

            def runs(client: int) -> None:  # one after another, until stopped
                for n in itertools.count():
                    if stop.is_set():
                        return
                    run = send_run(restate_server.ingress_url, AGENT, f"c{client}-{n}", "go")
                    results.append(attach(restate_server.ingress_url, run, timeout=60))

            clients = [threading.Thread(target=runs, args=(c,), daemon=True) for c in range(8)]
            for client in clients:
                client.start()
            try:
                wait_until(lambda: len(stamps(path)) >= 30, timeout=60, what="runs on replica a")
                joined.set()
                wait_until(
                    lambda: sum(r == "b" for _, r, _ in stamps(path)) >= 30,
                    timeout=20,
                    what="30 tool bodies on replica b, which joined under load",
                )
            finally:
                stop.set()
                for client in clients:
                    client.join(timeout=60)
    assert results and all(result["status"] == "completed" for result in results), results
    assert len(stamps(path)) == 3 * len(results)  # no body ran twice: nothing was cut off
    assert failed_attempts(restate_server) == failed_before
    assert cut_responses(restate_server) == cut_before


PACED_RUNS = 24
PACE = {"requestsPerMinute": 600, "burst": 1}
"""One call every 100 ms, one at a time."""


def test_a_models_rate_limit_paces_the_calls_of_both_replicas_as_one(
    restate_server: RestateServer, tmp_path: Path
) -> None:
    secret = {"TETHER_WEBHOOK_SECRET": "s3cret", "RESTATE_INGRESS_URL": restate_server.ingress_url}
    with serving(restate_server, tmp_path, 0, {"rateLimit": PACE}, **secret) as replicas:
        ports = itertools.cycle([replicas["a"].port, replicas["b"].port])  # connections alternate
        with ServiceFront(lambda: next(ports)) as front:
            restate_server.register(front.url)
            started = time.monotonic()
            runs = [
                send_run(restate_server.ingress_url, AGENT, f"p{i}", "go")
                for i in range(PACED_RUNS)
            ]
            results = [attach(restate_server.ingress_url, run, timeout=120) for run in runs]
            took = time.monotonic() - started
        logs = "".join(worker.log_path.read_text() for worker in replicas.values())
    assert all(result["status"] == "completed" for result in results), results
    # Both replicas ran runs, and their 96 calls (4 a run) went 100 ms apart: paced apart, each
    # replica would have taken about half of it.
    assert {replica for _, replica, _ in stamps(tmp_path / "stamps")} == {"a", "b"}
    calls = PACED_RUNS * 4
    assert took >= 0.9 * (calls - 1) * 0.1, f"{calls} calls in {took:.1f} s"
    assert "paced in this process" not in logs


def test_a_forged_or_stale_ask_for_a_slot_is_refused(
    restate_server: RestateServer, tmp_path: Path
) -> None:
    secret = {"TETHER_WEBHOOK_SECRET": "s3cret", "RESTATE_INGRESS_URL": restate_server.ingress_url}
    with serving(restate_server, tmp_path, 0, {"rateLimit": PACE}, **secret) as replicas:
        restate_server.register(replicas["a"].url)
        url = f"{restate_server.ingress_url}/{AGENT}-pace/scripted%2Fs/admit"
        pace = Pace(requests=Rate(2, burst=2), input_tokens=Rate(6_000))  # 100 tokens a second

        def ask(tokens: int, stamp: float, secret: bytes = b"s3cret") -> dict[str, Any]:
            body = pace_ask(pace, tokens, stamp)
            return {**body, "sig": pace_signature(secret, "scripted/s", body)}

        assert http("POST", url, ask(10, time.time(), b"guess")).status == 401
        assert http("POST", url, ask(10, time.time() - 3600)).status == 401
        assert http("POST", url, {**ask(10, time.time()), "tokens": 1}).status == 401  # altered
        assert http("POST", url, ask(10, time.time())).json() == 0  # the first slot, at once
        # 7,000 tokens more: 1,010 past the minute's worth, 10.1 s at 100 a second.
        assert http("POST", url, ask(7_000, time.time())).json() == pytest.approx(10_100, abs=500)
        # The third request in a minute: past the two at once, its slot is 30 s after the first.
        assert http("POST", url, ask(1, time.time())).json() == pytest.approx(30_000, abs=500)
