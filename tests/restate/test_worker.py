"""`tether worker --spec` as a real process on a real restate-server: runs and approvals."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import HypercornWorker, http, wait_until

from tether.restate_server import RestateServer
from tether.worker.parking import MAX_DECISION_TEXT, decision_of

WRITE_APPROVED = [
    {
        "text": "writing",
        "tool_calls": [{"name": "write_file", "input": {"path": "out.txt", "content": "yes"}}],
    },
    {"text": "done"},
]


def manifest(name: str, script: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": name},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": script},
            "tools": [
                {"name": "write_file", "builtin": "write_file", "requireApproval": True},
                {"name": "ask", "builtin": "ask_human"},
            ],
            **spec,
        },
    }


class Notifications(BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers["content-length"])
        type(self).received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()


@pytest.fixture
def notify_url() -> Iterator[str]:
    Notifications.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Notifications)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    server.shutdown()
    server.server_close()


@pytest.fixture
def agent_worker(
    restate_server: RestateServer, tmp_path: Path
) -> Iterator[Callable[[dict[str, Any]], HypercornWorker]]:
    workers: list[HypercornWorker] = []

    def start(document: dict[str, Any], **extra_env: str) -> HypercornWorker:
        spec = tmp_path / f"{document['metadata']['name']}.yaml"
        spec.write_text(yaml.safe_dump(document))
        command = [sys.executable, "-m", "tether", "worker", "--spec", str(spec)]
        command += ["--host", "127.0.0.1", "--port", "{port}"]
        env = {
            "TETHER_WORKSPACE": str(tmp_path),
            "TETHER_WEBHOOK_SECRET": "s3cret",
            "TETHER_WEBHOOK_BASE_URL": "http://sidecar.example",
            # Teardown stops workers that may be mid-run: do not wait the default 20 s for them.
            "TETHER_WORKER_GRACEFUL_TIMEOUT": "3",
            **extra_env,
        }
        worker = HypercornWorker("", command=command, env=env)
        workers.append(worker)
        worker.start()
        restate_server.register(worker.url)
        return worker

    yield start
    for worker in workers:
        worker.close()


def send_run(server: RestateServer, agent: str, key: str, prompt: str) -> str:
    response = http("POST", f"{server.ingress_url}/{agent}/{key}/run/send", {"prompt": prompt})
    assert response.status == 202, response.text
    invocation: str = response.json()["invocationId"]
    return invocation


def result_of(server: RestateServer, invocation: str) -> Any:
    url = f"{server.ingress_url}/restate/invocation/{invocation}/attach"
    response = http("GET", url, timeout=120)
    assert response.status == 200, response.text
    return response.json()


def parked(server: RestateServer, agent: str, key: str) -> list[dict[str, Any]]:
    response = http("POST", f"{server.ingress_url}/{agent}/{key}/pending")
    assert response.status == 200, response.text
    calls: list[dict[str, Any]] = response.json()
    return calls


def step_completed(server: RestateServer, invocation: str, prefix: str) -> bool:
    """The journal holds the run command named `prefix...` and, after it, its completion."""
    rows = server.query(
        f"SELECT index, entry_type, name FROM sys_journal WHERE id = '{invocation}' ORDER BY index"
    )
    started = [r["index"] for r in rows if (r.get("name") or "").startswith(prefix)]
    return bool(started) and any(
        r["index"] > started[0] and r["entry_type"] == "Notification: Run" for r in rows
    )


def resolve(server: RestateServer, awakeable: str, value: Any) -> None:
    url = f"{server.ingress_url}/restate/awakeables/{awakeable}/resolve"
    assert http("POST", url, value).status in (200, 202)


def name() -> str:
    return f"clerk-{uuid.uuid4().hex[:6]}"


def test_a_run_through_the_ingress(restate_server: RestateServer, agent_worker: Any) -> None:
    agent = name()
    agent_worker(manifest(agent, [{"text": "hello there"}]))
    response = http("POST", f"{restate_server.ingress_url}/{agent}/s1/run", {"prompt": "hi"})
    assert response.status == 200, response.text
    result = response.json()
    assert result["status"] == "completed" and result["text"] == "hello there"
    session = http("POST", f"{restate_server.ingress_url}/{agent}/s1/session").json()
    assert [t["role"] for t in session["turns"]] == ["user", "assistant"]
    assert session["status"] == "completed"


def test_the_worker_starts_without_alarming_log_lines(
    restate_server: RestateServer, agent_worker: Any
) -> None:
    worker = agent_worker(manifest(name(), [{"text": "hi"}]))
    lines = [x for x in worker.log_tail().splitlines() if x and not x.startswith("=== start")]
    assert len(lines) == 1 and "Running on" in lines[0], lines  # no "Lifespan error"


def test_an_approved_call_runs_and_the_record_goes(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path, notify_url: str
) -> None:
    agent = name()
    agent_worker(manifest(agent, WRITE_APPROVED, approvals={"notify": {"url": notify_url}}))
    invocation = send_run(restate_server, agent, "s1", "write it")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a parked call")
    assert call["tool"] == "write_file" and call["kind"] == "approval"
    assert json.loads(call["input_summary"]) == {"path": "out.txt", "content": "yes"}
    assert not (tmp_path / "out.txt").exists()
    [note] = wait_until(lambda: Notifications.received, what="the notification")
    assert note["awakeable_id"] == call["awakeable_id"]
    assert note["approve_url"].startswith(
        f"http://sidecar.example/v1/awakeables/{call['awakeable_id']}/approve?exp="
    )
    resolve(restate_server, call["awakeable_id"], {"approved": True})
    assert result_of(restate_server, invocation)["status"] == "completed"
    assert (tmp_path / "out.txt").read_text() == "yes"
    assert parked(restate_server, agent, "s1") == []
    assert len(Notifications.received) == 1


def test_a_denied_call_is_reported_to_the_model_and_not_run(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path
) -> None:
    agent = name()
    agent_worker(manifest(agent, WRITE_APPROVED))
    invocation = send_run(restate_server, agent, "s1", "write it")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a parked call")
    resolve(restate_server, call["awakeable_id"], {"approved": False, "reason": "not today"})
    assert result_of(restate_server, invocation)["status"] == "completed"
    assert not (tmp_path / "out.txt").exists()
    session = http("POST", f"{restate_server.ingress_url}/{agent}/s1/session").json()
    result = session["turns"][2]["content"][0]
    assert result["is_error"] and "Denied: not today" in result["content"]


def test_the_record_of_a_decision_keeps_who_decided_and_when() -> None:
    """The park's `park:end` step keeps `approved`, `by`, `approver` and `decided_at` of the
    resolution (the sidecar adds them); other shapes keep what they had: nothing."""
    by_link = {
        "approved": True,
        "by": "link",
        "approver": "alice@example.com",
        "decided_at": 1_700_000_000_000,
        "note": "not kept",
    }
    assert decision_of(by_link) == {k: v for k, v in by_link.items() if k != "note"}
    assert decision_of({"approved": False, "approver": None}) == {
        "approved": False, "approver": None
    }  # fmt: skip
    assert decision_of({"approved": True}) == {"approved": True}
    for other in (True, False, "yes", None, 3, ["a"], {"answer": "blue"}):
        assert decision_of(other) == {}
    hostile = {"approved": True, "approver": "x" * 100_000, "by": {"deep": ["structure"]}}
    assert decision_of(hostile) == {"approved": True, "approver": "x" * MAX_DECISION_TEXT}


@pytest.mark.parametrize(("policy", "written"), [("deny", False), ("approve", True)])
def test_the_timeout_policy_applies(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path, policy: str, written: bool
) -> None:
    agent = name()
    agent_worker(manifest(agent, WRITE_APPROVED, approvals={"timeout": "1s", "onTimeout": policy}))
    invocation = send_run(restate_server, agent, "s1", "write it")
    assert result_of(restate_server, invocation)["status"] == "completed"
    assert (tmp_path / "out.txt").exists() == written


def test_a_worker_killed_while_parked_is_replaced(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path, notify_url: str
) -> None:
    agent = name()
    worker = agent_worker(
        manifest(agent, WRITE_APPROVED, approvals={"notify": {"url": notify_url}})
    )
    invocation = send_run(restate_server, agent, "s1", "write it")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a parked call")
    # A notification whose step a crash cut off is sent again (at least once, with the
    # awakeable id to dedupe by); once the step is journaled, a replay never re-sends it.
    wait_until(
        lambda: step_completed(restate_server, invocation, "notify:"), what="the notify step"
    )
    worker.kill(signal.SIGKILL)
    worker.restart()
    resolve(restate_server, call["awakeable_id"], True)
    assert result_of(restate_server, invocation)["status"] == "completed"
    assert (tmp_path / "out.txt").read_text() == "yes"
    assert len(Notifications.received) == 1  # the notification step replayed, not re-sent


def test_ask_human_returns_the_answer(restate_server: RestateServer, agent_worker: Any) -> None:
    agent = name()
    script = [
        {"tool_calls": [{"name": "ask", "input": {"question": "Which region?"}}]},
        {"text": "ok"},
    ]
    agent_worker(manifest(agent, script))
    invocation = send_run(restate_server, agent, "s1", "deploy")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a question")
    assert call["kind"] == "ask_human"
    resolve(restate_server, call["awakeable_id"], {"answer": "eu-west-1"})
    assert result_of(restate_server, invocation)["status"] == "completed"
    session = http("POST", f"{restate_server.ingress_url}/{agent}/s1/session").json()
    assert session["turns"][2]["content"][0]["content"] == "eu-west-1"


def test_a_sigtermed_worker_exits_and_its_run_resumes_elsewhere(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path
) -> None:
    agent = name()
    script = [
        {"tool_calls": [{"name": "shell", "input": {"command": "echo started > marker; sleep 2"}}]},
        {"text": "done"},
    ]
    document = manifest(agent, script)
    document["spec"]["tools"] = [{"name": "shell", "builtin": "shell"}]
    worker = agent_worker(document)
    invocation = send_run(restate_server, agent, "s1", "work")
    wait_until(lambda: (tmp_path / "marker").exists(), what="the tool to start")
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGTERM)  # what Kubernetes sends the container on a rollout
    started = time.monotonic()
    wait_until(lambda: worker.returncode() is not None, timeout=30, what="the worker to exit")
    assert time.monotonic() - started < 25  # inside the grace period
    worker.kill(signal.SIGKILL)  # reap the group (nothing should be left)
    worker.restart()  # "elsewhere": a new worker behind the same URL
    result = result_of(restate_server, invocation)
    assert result["status"] == "completed" and result["text"] == "done"


STUBBORN_TOOL = """
import asyncio
import os
from pathlib import Path

from tether import tool


@tool
async def stubborn() -> str:
    \"\"\"Works forever and ignores cancellation.\"\"\"
    (Path(os.environ["TETHER_WORKSPACE"]) / "stubborn.started").write_text("yes")
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue
"""


def test_a_worker_that_does_not_drain_is_stopped_after_its_graceful_timeout(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path
) -> None:
    """hypercorn waits for in-flight work on SIGTERM; a stream that never ends would keep the
    worker alive until Kubernetes kills the pod. `tether worker` ends it itself."""
    (tmp_path / "stubborn_tools.py").write_text(STUBBORN_TOOL)
    agent = name()
    document = manifest(agent, [{"tool_calls": [{"name": "stubborn", "input": {}}]}])
    document["spec"]["tools"] = [{"name": "stubborn", "python": "stubborn_tools:stubborn"}]
    worker = agent_worker(document, TETHER_WORKER_GRACEFUL_TIMEOUT="3")
    send_run(restate_server, agent, "s1", "work")
    wait_until(lambda: (tmp_path / "stubborn.started").exists(), what="the tool to start")
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGTERM)
    started = time.monotonic()
    wait_until(lambda: worker.returncode() is not None, timeout=30, what="the worker to exit")
    assert time.monotonic() - started < 3 + 2 + 2  # graceful timeout + margin + polling
    assert worker.returncode() == 1
    assert "did not stop within its graceful timeout" in worker.log_tail()
