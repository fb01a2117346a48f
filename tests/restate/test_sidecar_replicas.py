"""Two replicas of the sidecar (two `tether sidecar` processes) in front of one real
restate-server and one real `tether worker`: a signed request acts at most once, whichever
replica gets it and however often a replica restarts.

Every test replays a captured signed request byte for byte (or with its unsigned
`Idempotency-Key` header stripped) to the other replica, or to a replica restarted since, and
checks in Restate what happened: how many invocations of `run` the session has, what the agent
read from its inbox, which answer the parked call got.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest

from tests.restate.support import approval_manifest, wait_until
from tether.programs.dev import DevStack, Process, wait_for
from tether.programs.restate_server import free_port
from tether.programs.webhooks import sign_request
from tether.programs.worker.inbox import MAX_WAITING

AGENT = "replicated"
PROMPT = {"prompt": "write it"}
SCRIPT = [
    {"tool_calls": [{"name": "write_file", "input": {"path": "out.txt", "content": "yes"}}]},
    {"text": "done"},
]
JSON = "application/json"
TIMEOUT = 120.0  # generous: other suites share the two cores


@dataclass(frozen=True)
class Signed:
    """A captured signed request: its path, body and headers, to send again as they are."""

    path: str
    body: bytes
    headers: dict[str, str]

    def without(self, header: str) -> Signed:
        kept = {name: value for name, value in self.headers.items() if name != header}
        return Signed(self.path, self.body, kept)


@dataclass
class Replicas:
    stack: DevStack
    second: Process
    second_port: int

    @property
    def urls(self) -> tuple[str, str]:
        return self.stack.sidecar_url, f"http://127.0.0.1:{self.second_port}"

    def sign(self, path: str, value: Any, idempotency_key: str | None = None) -> Signed:
        """A signed request, as a sender makes it: with a key, the signature covers it
        (`HMAC(secret, "<timestamp>.<path>\\n<key>\\n<body>")`, spelled out to pin the format)."""
        body = json.dumps(value).encode()
        secret = self.stack.secret.encode()
        if idempotency_key is None:
            headers = sign_request(secret, body, path=path)
        else:
            stamp = int(time.time())
            message = f"{stamp}.{path}\n{idempotency_key}\n".encode() + body
            headers = {
                "x-tether-timestamp": str(stamp),
                "x-tether-signature": "v1=" + hmac.new(secret, message, hashlib.sha256).hexdigest(),
                "idempotency-key": idempotency_key,
            }
        return Signed(path, body, {**headers, "content-type": JSON})

    def send(self, replica: str, request: Signed) -> httpx2.Response:
        return httpx2.post(
            f"{replica}{request.path}", content=request.body, headers=request.headers, timeout=60
        )

    def restart_second(self) -> None:
        """Stop the second replica (SIGTERM, as a rollout does) and start a fresh process."""
        self.second.kill(signal.SIGTERM)
        self.second.start()
        wait_for(f"{self.urls[1]}/readyz", "second sidecar", self.second, timeout=TIMEOUT)

    # -- Restate --------------------------------------------------------------------------

    def runs_of(self, session: str) -> list[dict[str, Any]]:
        """Every invocation of the session's `run` handler Restate has (running, suspended,
        queued behind another, or completed and kept for its idempotency key)."""
        return self.stack.server.query(
            "SELECT id, status FROM sys_invocation "
            f"WHERE target_service_name = '{AGENT}' AND target_service_key = '{session}' "
            "AND target_handler_name = 'run'"
        )

    def parked(self, session: str) -> dict[str, Any] | None:
        headers = sign_request(self.stack.secret.encode(), b"", path="/v1/approvals")
        response = httpx2.get(f"{self.urls[0]}/v1/approvals", headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        return next((p for p in response.json()["parked"] if p["session"] == session), None)

    def wait_parked(self, session: str) -> dict[str, Any]:
        return wait_until(
            lambda: self.parked(session), timeout=TIMEOUT, what=f"the parked call of {session}"
        )

    def result(self, invocation: str) -> Any:
        url = f"{self.stack.server.ingress_url}/restate/invocation/{invocation}/attach"
        return httpx2.get(url, timeout=TIMEOUT).json()

    def turns(self, session: str) -> list[dict[str, Any]]:
        url = f"{self.stack.server.ingress_url}/{AGENT}/{session}/session"
        turns: list[dict[str, Any]] = httpx2.post(url, timeout=60).json()["turns"]
        return turns

    @contextmanager
    def worker_stopped(self) -> Iterator[None]:
        """The worker frozen (SIGSTOP): an answer cannot reach the run, so the call stays
        parked while the replicas are asked again."""
        assert self.stack.worker.popen is not None
        group = self.stack.worker.popen.pid
        os.killpg(group, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(group, signal.SIGCONT)


def blocks(turns: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        block
        for turn in turns
        for block in (turn["content"] if isinstance(turn["content"], list) else [])
        if block.get("type") == kind
    ]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    base = tmp_path_factory.mktemp("replicas")
    with pytest.MonkeyPatch.context() as env:
        workspace = base / "workspace"  # (the stack's state stays out of the agent's reach)
        workspace.mkdir()
        env.setenv("TETHER_WORKSPACE", str(workspace))
        env.delenv("TETHER_WEBHOOK_SECRET", raising=False)
        with DevStack(approval_manifest(base, AGENT, SCRIPT), base / "dev") as stack:
            port = free_port()
            command = [sys.executable, "-m", "tether", "sidecar", "--host", "127.0.0.1"]
            second = Process(
                "second sidecar",
                [*command, "--port", str(port)],
                dict(stack.sidecar.env),  # the same agent, secret, Restate and metrics
                base / "dev" / "sidecar-2.log",
            )
            second.start()
            try:
                wait_for(f"http://127.0.0.1:{port}/readyz", "second sidecar", second)
                yield Replicas(stack, second, port)
            finally:
                second.kill(signal.SIGTERM)


def start_parked_run(replicas: Replicas, session: str) -> tuple[str, dict[str, Any]]:
    """A run started through the first replica, parked on its approval."""
    started = replicas.send(replicas.urls[0], replicas.sign(f"/v1/sessions/{session}/runs", PROMPT))
    assert started.status_code == 202, started.text
    return started.json()["invocation_id"], replicas.wait_parked(session)


# --------------------------------------------------------------------------------------------


def test_a_start_run_replayed_to_the_other_replica_starts_no_second_run(
    replicas: Replicas,
) -> None:
    one, other = replicas.urls
    captured = replicas.sign("/v1/sessions/run-replayed/runs", PROMPT)
    first = replicas.send(one, captured)
    assert first.status_code == 202, first.text
    assert first.json()["status"] == "Accepted"

    replayed = replicas.send(other, captured)
    assert replayed.status_code == 409, replayed.text
    assert replayed.json()["outcome"] == "replayed"
    assert "invocation_id" not in replayed.json()  # a replayer learns nothing of the run
    assert [run["id"] for run in replicas.runs_of("run-replayed")] == [
        first.json()["invocation_id"]
    ]

    # With the sender's (signed) key, the replay is the same run, and is told so.
    keyed = replicas.sign("/v1/sessions/run-keyed/runs", PROMPT, idempotency_key="delivery-1")
    first = replicas.send(one, keyed)
    assert first.status_code == 202, first.text
    again = replicas.send(other, keyed)
    assert again.status_code == 202, again.text
    assert again.json() == {**first.json(), "status": "PreviouslyAccepted"}
    assert len(replicas.runs_of("run-keyed")) == 1


def test_a_start_run_with_its_idempotency_key_stripped_starts_no_second_run(
    replicas: Replicas,
) -> None:
    one, other = replicas.urls
    captured = replicas.sign("/v1/sessions/run-stripped/runs", PROMPT, idempotency_key="d-2")
    first = replicas.send(one, captured)
    assert first.status_code == 202, first.text

    stripped = captured.without("idempotency-key")
    changed = Signed(captured.path, captured.body, {**captured.headers, "idempotency-key": "d-3"})
    for replica in (other, one):
        for replay in (stripped, changed):
            refused = replicas.send(replica, replay)
            assert refused.status_code == 401, refused.text
            assert refused.json()["outcome"] == "bad_signature"
    assert [run["id"] for run in replicas.runs_of("run-stripped")] == [
        first.json()["invocation_id"]
    ]


def test_a_message_replayed_to_the_other_replica_is_delivered_once(replicas: Replicas) -> None:
    one, other = replicas.urls
    invocation, call = start_parked_run(replicas, "talk")
    text = "ship it to staging first"
    captured = replicas.sign("/v1/sessions/talk/messages", {"text": text})
    posted = replicas.send(one, captured)
    assert posted.status_code == 202, posted.text
    assert posted.json() == {"session": "talk", "waiting": 1}

    replayed = replicas.send(other, captured)
    assert replayed.status_code == 409, replayed.text
    assert replayed.json()["outcome"] == "replayed"

    path = f"/v1/awakeables/{call['awakeable_id']}/resolve"
    approved = replicas.send(one, replicas.sign(path, {"approved": True}))
    assert approved.status_code == 202, approved.text
    assert replicas.result(invocation)["status"] == "completed"
    received = [b["text"] for b in blocks(replicas.turns("talk"), "text") if b["text"] == text]
    assert received == [text]  # the agent read it once


def test_an_approval_sent_to_both_replicas_is_answered_once(replicas: Replicas) -> None:
    one, other = replicas.urls
    invocation, call = start_parked_run(replicas, "approve-twice")
    path = f"/v1/awakeables/{call['awakeable_id']}/resolve"
    denial = replicas.sign(path, {"approved": False, "approver": "alice"})
    approval = replicas.sign(path, {"approved": True, "approver": "bob"})
    with replicas.worker_stopped():  # both answers arrive while the call is parked
        denied = replicas.send(one, denial)
        assert denied.status_code == 202, denied.text
        for replica, request in ((other, approval), (other, denial), (one, approval)):
            late = replicas.send(replica, request)
            assert late.status_code == 409, late.text
            assert late.json()["outcome"] in ("already_resolved", "replayed")
        assert (
            replicas.send(other, approval)
            .json()["error"]
            .startswith("this call was already answered")
        )
    assert replicas.result(invocation)["status"] == "completed"
    [result] = blocks(replicas.turns("approve-twice"), "tool_result")
    assert result.get("is_error"), result  # the first answer, a denial, is the one the run got


def test_a_restarted_replica_acts_on_nothing_it_did_before(replicas: Replicas) -> None:
    """A restart empties the replay guard and the ledger of a process: what it did before is
    still known, in Restate."""
    other = replicas.urls[1]
    session = "restarted"
    run = replicas.sign(f"/v1/sessions/{session}/runs", PROMPT)
    started = replicas.send(other, run)
    assert started.status_code == 202, started.text
    invocation = started.json()["invocation_id"]
    call = replicas.wait_parked(session)
    text = "the customer called back"
    message = replicas.sign(f"/v1/sessions/{session}/messages", {"text": text})
    assert replicas.send(other, message).status_code == 202
    answer = replicas.sign(f"/v1/awakeables/{call['awakeable_id']}/resolve", {"approved": True})
    with replicas.worker_stopped():  # the call stays parked across the restart
        assert replicas.send(other, answer).status_code == 202
        replicas.restart_second()
        statuses = {
            what: replicas.send(other, request)
            for what, request in (("run", run), ("message", message), ("answer", answer))
        }
        assert {what: r.status_code for what, r in statuses.items()} == {
            "run": 409, "message": 409, "answer": 409
        }  # fmt: skip
        assert statuses["answer"].json()["outcome"] == "already_resolved"
    assert replicas.result(invocation)["status"] == "completed"
    assert [run["id"] for run in replicas.runs_of(session)] == [invocation]
    turns = replicas.turns(session)
    assert [b["text"] for b in blocks(turns, "text") if b["text"] == text] == [text]
    [result] = blocks(turns, "tool_result")
    assert not result.get("is_error"), result  # the run went on with the one approval


def test_a_message_the_inbox_refuses_is_answered_with_the_inboxs_reason(
    replicas: Replicas,
) -> None:
    """A full inbox is the caller's to wait for (429), a text no run could store the caller's to
    mend (400): each said as such, not as Restate's fault (502)."""
    one, _ = replicas.urls
    inbox = f"{replicas.stack.server.ingress_url}/{AGENT}-inbox/crowded/post"
    for _ in range(MAX_WAITING - 1):
        assert httpx2.post(inbox, json={"text": "hi"}, timeout=10).status_code == 200
    last = replicas.send(one, replicas.sign("/v1/sessions/crowded/messages", {"text": "last"}))
    assert last.status_code == 202 and last.json()["waiting"] == MAX_WAITING, last.text

    full = replicas.send(one, replicas.sign("/v1/sessions/crowded/messages", {"text": "more"}))
    assert full.status_code == 429, full.text
    assert full.json()["outcome"] == "too_many"
    assert f"holds {MAX_WAITING} messages" in full.json()["error"]

    lone = replicas.sign("/v1/sessions/talk/messages", {"text": "hi \ud800"})
    refused = replicas.send(one, lone)
    assert refused.status_code == 400 and refused.json()["outcome"] == "bad_body", refused.text
