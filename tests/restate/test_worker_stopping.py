"""A worker that is stopped (SIGTERM: a scale-down, a node drain) hands its runs to the other
replicas at their turns' boundaries (`RestateRuntimeOptions.stopping`).

Two `tether worker` replicas behind a Kubernetes-like Service on a real restate-server, with
`test_handoff`'s agent: a run's first tool body is held on replica a when a is sent SIGTERM, as
the kubelet stops a pod, and the Service stops routing to it. The body ends on a and its result
is journaled there; the run's next model step then runs on b, at once, not at the end of a's
graceful timeout (30 s here), and a exits. Without it, the run stays on a until the timeout:
each model call started there meanwhile is cut off at its end, and paid for again elsewhere.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.restate.support import attach, send_run
from tests.restate.test_handoff import (
    AGENT,
    Route,
    metrics_dir,
    replicas,
    stamps,
    tool_results,
)
from tests.restate.test_intents import Attempt
from tether.programs.metrics import merged_files
from tether.programs.restate_server import RestateServer
from tether.restate import restate_runtime
from tether.restate.errors import WorkerStopping, is_restate_control_error
from tether.testing import HypercornWorker, ServiceFront, wait_until

GRACEFUL_TIMEOUT = 30.0


def test_a_live_run_leaves_before_its_next_model_step_once_its_worker_stops() -> None:
    async def value() -> Any:
        return {"at": 1.0}

    async def main() -> None:
        stopped = False
        ctx = Attempt({"model:0": {"at": 0.0}})  # steps not in its journal run
        durable = restate_runtime(ctx, promises=None, stopping=lambda: stopped)
        stopped = True
        await durable.step("model", "model:0", value)  # replayed: not a model call here
        await durable.step("tool", "tool:0", value)  # live: the turn in flight ends here
        with pytest.raises(WorkerStopping) as stopping:
            await durable.step("model", "model:1", value)
        assert ctx.ran == ["tool:0"]
        assert is_restate_control_error(stopping.value)  # no tool or loop turns it into a result
        assert stopping.value.retry_after == timedelta(0)  # Restate retries at once
        stopped = False
        assert await durable.step("model", "model:1", value) == {"at": 1.0}

    asyncio.run(main())


def counted(directory: Path, name: str) -> float:
    """The sum of a counter's series that a replica's processes wrote to `directory`."""
    families = merged_files(directory).collect()
    return sum(
        sample.value for family in families for sample in family.samples if sample.name == name
    )


def answering(worker: HypercornWorker) -> bool:
    """Whether the worker answers a request: once it stops, its port refuses connections."""
    try:
        return httpx2.get(f"{worker.url}/health", timeout=0.5).status_code == 200
    except httpx2.HTTPError:
        return False


@pytest.fixture
def stack(
    restate_server: RestateServer, tmp_path: Path
) -> Iterator[tuple[dict[str, HypercornWorker], Route]]:
    with replicas(restate_server, tmp_path, graceful_timeout=GRACEFUL_TIMEOUT) as workers:
        route = Route(workers["a"].port, workers["b"].port)
        with ServiceFront(route) as front:
            restate_server.register(front.url)
            yield workers, route


def stop_a_while_its_body_runs(
    server: RestateServer,
    stack: tuple[dict[str, HypercornWorker], Route],
    directory: Path,
    session: str,
    endpoints_updated: bool = True,
) -> tuple[str, HypercornWorker]:
    """A run of `session` whose first body is held on replica a, then a stopped (the kubelet's
    SIGTERM) and, with `endpoints_updated`, left out of the Service's endpoints: the run's
    invocation id, and a."""
    workers, route = stack
    invocation = send_run(server.ingress_url, AGENT, session, "go")
    wait_until(lambda: "start 0 a" in stamps(directory), timeout=60, what="body 0 on replica a")
    if endpoints_updated:
        route.to_b()
    workers["a"].terminate()
    wait_until(lambda: not answering(workers["a"]), timeout=10, what="replica a to stop")
    return invocation, workers["a"]


def test_a_stopped_worker_hands_its_run_over_at_the_turns_boundary(
    restate_server: RestateServer,
    stack: tuple[dict[str, HypercornWorker], Route],
    tmp_path: Path,
) -> None:
    invocation, a = stop_a_while_its_body_runs(restate_server, stack, tmp_path, "s-stopped")
    released = time.monotonic()
    (tmp_path / "release").touch()
    result = attach(restate_server.ingress_url, invocation, timeout=60)
    assert result["status"] == "completed", result
    # body 0 ended where it ran; the next turn, its model step first, ran on b
    assert stamps(tmp_path) == ["start 0 a", "end 0 a", "start 1 b", "end 1 b"]
    results = tool_results(restate_server, "s-stopped")
    assert "recorded 0 on a" in str(results["call_0_0"]["content"]), results
    assert "recorded 1 on b" in str(results["call_1_0"]["content"]), results
    # and a, with nothing left in flight, exited long before its graceful timeout
    wait_until(lambda: a.returncode() is not None, timeout=15, what="replica a to exit")
    took = time.monotonic() - released
    assert took < GRACEFUL_TIMEOUT / 2, f"replica a exited {took:.1f} s after the body ended"
    # a counted the run that left it; b, where it went on, counted none
    left = "tether_runs_left_stopping_worker_total"
    assert counted(metrics_dir(tmp_path, "a"), left) == 1
    assert counted(metrics_dir(tmp_path, "b"), left) == 0


def test_a_request_refused_while_stopping_cuts_no_run_in_flight_off(
    restate_server: RestateServer,
    stack: tuple[dict[str, HypercornWorker], Route],
    tmp_path: Path,
) -> None:
    invocation, _ = stop_a_while_its_body_runs(restate_server, stack, tmp_path, "s-refused")
    # Restate puts the next invocation on its connection to a, which refuses it (and, before
    # `connection_age`'s fix, cancelled the run in flight there with it); it goes to b.
    other = send_run(restate_server.ingress_url, AGENT, "s-refused-other", "go")
    wait_until(lambda: "start 0 b" in stamps(tmp_path), timeout=30, what="the other run on b")
    (tmp_path / "release").touch()
    for run in (invocation, other):
        assert attach(restate_server.ingress_url, run, timeout=60)["status"] == "completed"
    results = tool_results(restate_server, "s-refused")
    assert "recorded 0 on a" in str(results["call_0_0"]["content"]), results
    assert stamps(tmp_path).count("start 0 a") == 1


def test_a_connection_to_a_stopped_worker_is_refused_not_left_unanswered(
    restate_server: RestateServer,
    stack: tuple[dict[str, HypercornWorker], Route],
    tmp_path: Path,
) -> None:
    """A Service's endpoints change a moment after its pod starts terminating: meanwhile new
    connections still reach the stopped worker. Hypercorn's parent keeps the listening socket
    open; without the worker's shutting it down, such a connection is queued unanswered, and
    Restate gave an attempt on it up only after about 10 s."""
    _, route = stack
    invocation, a = stop_a_while_its_body_runs(
        restate_server, stack, tmp_path, "s-late-endpoints", endpoints_updated=False
    )
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", a.port), timeout=5).close()
    released = time.monotonic()
    (tmp_path / "release").touch()
    time.sleep(2.0)  # the endpoints, late: Restate's next connections meanwhile reach a
    route.to_b()
    assert attach(restate_server.ingress_url, invocation, timeout=60)["status"] == "completed"
    took = time.monotonic() - released
    assert took < 7.0, f"the run ended {took:.1f} s after its body"
