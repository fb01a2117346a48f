"""An unsafe tool body handed from one worker replica to another (`programs.worker.handoff`).

Two `tether worker` replicas behind a Kubernetes-like Service (`tether.testing.ServiceFront`) on
a real restate-server. A run's unsafe tool body is held running on replica a when every
connection through the Service is cut (as a lost Restate node or network path cuts them) and the
next ones go to replica b: Restate's next attempt of the run lands on b, which finds the intent
journaled and the body's result missing. Replica a hands the body over through Restate while it
runs and once it ends, so b journals its real result, and the body ran once. When replica a is
SIGKILLed instead, nothing is handed over: b reports the body interrupted at once, as before.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.restate.support import attach, send_run, worker_process
from tests.restate.test_worker import manifest
from tether.programs.restate_server import RestateServer
from tether.programs.webhooks import handoff_peek_signature, handoff_signature
from tether.programs.worker import handoff_client
from tether.programs.worker.handoff_client import RestateHandoff
from tether.restate.intents import NOT_HERE
from tether.testing import HypercornWorker, ServiceFront, wait_until

AGENT = "handoff-agent"
SECRET = b"handoff-test-secret-0123456789abcdef"
TOOL = '''
import asyncio, os
from pathlib import Path

from tether import tool


@tool
async def record(n: int) -> str:
    """Records step n (unsafe: journaled behind an intent)."""
    stamps = Path(os.environ["HANDOFF_STAMPS"])
    replica = os.environ["HANDOFF_REPLICA"]
    with stamps.open("a") as out:
        out.write("start %d %s\\n" % (n, replica))
    release = Path(os.environ["HANDOFF_RELEASE"])
    while n == 0 and not release.exists():
        await asyncio.sleep(0.02)
    with stamps.open("a") as out:
        out.write("end %d %s\\n" % (n, replica))
    return "recorded %d on %s" % (n, replica)
'''


class Route:
    """The Service's endpoints: replica `a` until `to_b()`."""

    def __init__(self, a: int, b: int) -> None:
        self.ports, self.current = {"a": a, "b": b}, "a"

    def to_b(self) -> None:
        self.current = "b"

    def __call__(self) -> int:
        return self.ports[self.current]


@contextmanager
def replicas(
    server: RestateServer, directory: Path, graceful_timeout: float = 1.0
) -> Iterator[dict[str, HypercornWorker]]:
    """Replicas `a` and `b` of one `tether worker` (index included), on ports of their own."""
    (directory / "handoff_tools.py").write_text(TOOL)
    script = [
        {"text": f"step {n}", "tool_calls": [{"name": "record", "input": {"n": n}}]}
        for n in range(2)
    ]
    tools = [{"name": "record", "python": "handoff_tools:record"}]
    document = manifest(AGENT, [*script, {"text": "done"}], tools=tools)
    with ExitStack() as stack:
        workers: dict[str, HypercornWorker] = {}
        for name in ("a", "b"):
            worker = worker_process(
                server,
                directory,
                document,
                TETHER_WORKER_GRACEFUL_TIMEOUT=str(graceful_timeout),
                TETHER_WEBHOOK_SECRET=SECRET.decode(),
                RESTATE_INGRESS_URL=server.ingress_url,
                HANDOFF_STAMPS=str(directory / "stamps"),
                HANDOFF_RELEASE=str(directory / "release"),
                HANDOFF_REPLICA=name,
                PROMETHEUS_MULTIPROC_DIR=str(metrics_dir(directory, name)),
            )
            workers[name] = stack.enter_context(worker)
        yield workers


def metrics_dir(directory: Path, replica: str) -> Path:
    """Where a replica's processes write their metrics (kept after they exit)."""
    path = directory / f"metrics-{replica}"
    path.mkdir(exist_ok=True)
    return path


def stamps(directory: Path) -> list[str]:
    path = directory / "stamps"
    return path.read_text().splitlines() if path.exists() else []


def tool_results(server: RestateServer, session: str) -> dict[str, dict[str, Any]]:
    """The session's tool results, by call id."""
    response = httpx2.post(f"{server.ingress_url}/{AGENT}/{session}/session", json=None, timeout=30)
    assert response.status_code == 200, response.text
    blocks = [b for t in response.json()["turns"] if t["role"] == "user" for b in t["content"]]
    return {b["tool_use_id"]: b for b in blocks if b.get("type") == "tool_result"}


def handed_over(server: RestateServer) -> int:
    """Nonces with a record in `<agent>-handoff`."""
    rows = server.query(f"SELECT count(*) AS n FROM state WHERE service_name = '{AGENT}-handoff'")
    return int(rows[0]["n"])


Stack = tuple[dict[str, HypercornWorker], Route, ServiceFront]
"""The replicas, the Service's route to them, the Service."""


def ended(server: RestateServer, invocation: str) -> bool:
    rows = server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation}'")
    return bool(rows) and rows[0]["status"] == "completed"


@pytest.fixture
def stack(restate_server: RestateServer, tmp_path: Path) -> Iterator[Stack]:
    with replicas(restate_server, tmp_path) as workers:
        route = Route(workers["a"].port, workers["b"].port)
        with ServiceFront(route) as front:
            restate_server.register(front.url)
            yield workers, route, front


def test_a_body_whose_run_moved_to_another_replica_is_journaled_there_not_run_again(
    restate_server: RestateServer,
    stack: Stack,
    tmp_path: Path,
) -> None:
    _, route, front = stack
    before = handed_over(restate_server)
    invocation = send_run(restate_server.ingress_url, AGENT, "s-moved", "go")
    wait_until(lambda: "start 0 a" in stamps(tmp_path), timeout=60, what="body 0 on replica a")
    route.to_b()
    front.cut()
    # a says the body still runs; b's attempt, meanwhile, waits for it (or, without the
    # handover, has reported it interrupted and gone on)
    wait_until(
        lambda: handed_over(restate_server) > before or ended(restate_server, invocation),
        timeout=30,
        what="the handover",
    )
    (tmp_path / "release").touch()
    result = attach(restate_server.ingress_url, invocation, timeout=60)
    assert result["status"] == "completed", result
    assert stamps(tmp_path) == ["start 0 a", "end 0 a", "start 1 b", "end 1 b"]
    results = tool_results(restate_server, "s-moved")
    assert not results["call_0_0"].get("is_error"), results
    assert "recorded 0 on a" in str(results["call_0_0"]["content"]), results


def test_a_body_whose_replica_died_is_reported_interrupted_at_once(
    restate_server: RestateServer,
    stack: Stack,
    tmp_path: Path,
) -> None:
    workers, route, _ = stack
    invocation = send_run(restate_server.ingress_url, AGENT, "s-died", "go")
    wait_until(lambda: "start 0 a" in stamps(tmp_path), timeout=60, what="body 0 on replica a")
    route.to_b()
    killed = time.monotonic()
    workers["a"].kill()
    result = attach(restate_server.ingress_url, invocation, timeout=60)
    took = time.monotonic() - killed
    assert result["status"] == "completed", result
    assert stamps(tmp_path) == ["start 0 a", "start 1 b", "end 1 b"]  # never run again
    results = tool_results(restate_server, "s-died")
    assert results["call_0_0"].get("is_error"), results
    assert "interrupted" in str(results["call_0_0"]["content"]), results
    assert took < 5.0, f"the run ended {took:.1f} s after the kill"


def post(server: RestateServer, nonce: str, handler: str, body: Any) -> httpx2.Response:
    url = f"{server.ingress_url}/{AGENT}-handoff/{nonce}/{handler}"
    return httpx2.post(url, json=body, timeout=30)


def test_only_a_worker_hands_a_result_over_or_reads_one(
    restate_server: RestateServer, stack: Stack
) -> None:
    note = {"call": "tool:c1", "done": True, "result": {"content": "forged"}}
    forged = {**note, "sig": handoff_signature(b"not-the-secret", "n1", "tool:c1", note)}
    assert post(restate_server, "n1", "put", forged).status_code == 401
    signed = {**note, "sig": handoff_signature(SECRET, "n1", "tool:c1", note)}
    assert (
        post(restate_server, "n1", "put", {**signed, "result": {"content": "changed"}}).status_code
        == 401
    )
    assert post(restate_server, "n1", "put", signed).status_code == 200

    asked = {"call": "tool:c1", "sig": handoff_peek_signature(SECRET, "n1", "tool:c1")}
    answer = post(restate_server, "n1", "peek", asked)
    assert answer.status_code == 200 and answer.json()["result"] == {"content": "forged"}
    for refused in (
        {"call": "tool:c1", "sig": handoff_peek_signature(b"not-the-secret", "n1", "tool:c1")},
        {"call": "tool:c1", "sig": handoff_peek_signature(SECRET, "n2", "tool:c1")},  # another's
        {"call": "tool:c1"},
    ):
        response = post(restate_server, "n1", "peek", refused)
        assert response.status_code in (400, 401), response.text
        assert "forged" not in response.text

    # a heartbeat sent again (captured on the way) counts once: it cannot keep an asker waiting
    beat = {"call": "tool:c1", "done": False, "beat": 1}
    beat["sig"] = handoff_signature(SECRET, "n3", "tool:c1", beat)
    asked = {"call": "tool:c1", "sig": handoff_peek_signature(SECRET, "n3", "tool:c1")}
    for _ in range(3):
        assert post(restate_server, "n3", "put", beat).status_code == 200
        assert post(restate_server, "n3", "peek", asked).json() == {"done": False, "beats": 1}


async def test_a_waiting_attempt_gives_up_once_the_heartbeats_stop(
    restate_server: RestateServer,
    stack: Stack,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(handoff_client, "HEARTBEAT_SECONDS", 0.2)
    monkeypatch.setattr(handoff_client, "STALE_SECONDS", 1.0)
    sender = RestateHandoff(AGENT, restate_server.ingress_url, SECRET)
    receiver = RestateHandoff(AGENT, restate_server.ingress_url, SECRET)

    async def heard_of(nonce: str) -> None:  # its first heartbeat is in
        asked = {"call": "tool:c1", "sig": handoff_peek_signature(SECRET, nonce, "tool:c1")}
        for _ in range(200):
            answer = await asyncio.to_thread(post, restate_server, nonce, "peek", asked)
            if answer.content and answer.json():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{nonce} was never handed over")

    release = asyncio.Event()

    async def slow_body() -> dict[str, str]:
        await release.wait()
        return {"content": "slow"}

    sender.hand_over("n-slow", {"tool:c1": asyncio.ensure_future(slow_body())})
    await heard_of("n-slow")
    started = time.monotonic()
    asyncio.get_running_loop().call_later(2.0, release.set)
    # heard from every 0.2 s: waited for past the 1 s of silence it allows
    assert await receiver.result("n-slow", "tool:c1") == {"content": "slow"}
    assert time.monotonic() - started >= 2.0

    stuck = asyncio.ensure_future(asyncio.Event().wait())
    sender.hand_over("n-stuck", {"tool:c1": stuck})
    await heard_of("n-stuck")
    for offering in list(sender._offering.values()):  # the sender dies: no more heartbeats
        offering.cancel()
    started = time.monotonic()
    assert await receiver.result("n-stuck", "tool:c1") is NOT_HERE
    assert 1.0 <= time.monotonic() - started < 5.0
    stuck.cancel()
