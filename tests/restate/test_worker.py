"""`tether worker --spec` as a real process on a real restate-server: runs and approvals."""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from tests.fakes.model_server import ErrorReply, ModelServer, Reply, ToolCall
from tests.restate.support import (
    PROC_PROBE,
    HypercornWorker,
    http,
    wait_until,
    without_capabilities,
    worker_process,
)
from tether.parked import PARKED_STATE_KEY
from tether.programs.restate_identity import new_private_key_pem, public_key_of
from tether.programs.restate_server import IDENTITY_KEY_FILE, RestateServer, free_port
from tether.programs.webhooks import SignatureError, answer_proof, listing_token, verify_link
from tether.spec import parse_agent
from tether.spec.stopping import stop_grace_seconds
from tether.tools.human import MAX_DECISION_TEXT, decision_of

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


def one_model(model_server: ModelServer, **model: Any) -> dict[str, Any]:
    """Anthropic's model on `model_server`."""
    return {
        "provider": "anthropic",
        "name": "claude-test",
        "baseUrl": model_server.anthropic_url,
        **model,
    }


def two_models(model_server: ModelServer, **model: Any) -> dict[str, Any]:
    """Anthropic's model, then OpenAI's as its fallback, both on `model_server` (a request's
    path says which model it went to)."""
    fallback = {"provider": "openai", "name": "gpt-test", "baseUrl": model_server.openai_url}
    return one_model(model_server, fallbacks=[fallback], **model)


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

    def start(
        document: dict[str, Any], *, prefix: Sequence[str] = (), **extra_env: str | None
    ) -> HypercornWorker:
        """`extra_env` adds to the worker's environment, or with None takes a variable out."""
        worker = worker_process(
            restate_server,
            tmp_path,
            document,
            prefix=prefix,
            **{
                "TETHER_WEBHOOK_SECRET": "s3cret",
                "TETHER_WEBHOOK_BASE_URL": "http://sidecar.example",
                # Teardown stops workers that may be mid-run: do not wait 20 s for them.
                "TETHER_WORKER_GRACEFUL_TIMEOUT": "3",
                **extra_env,
            },
        )
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
    """The session's parked calls with their awakeable ids, which only the admin API shows (the
    ingress's `pending` lists the calls without them)."""
    rows = server.query(
        f"SELECT value_utf8 FROM state WHERE service_name = '{agent}' "
        f"AND service_key = '{key}' AND key = '{PARKED_STATE_KEY}'"
    )
    calls: list[dict[str, Any]] = [
        call for row in rows for call in json.loads(row["value_utf8"] or "{}").values()
    ]
    return sorted(calls, key=lambda call: call["created_at"])


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
    invocation = send_run(restate_server, agent, "s1", "hi")
    result = result_of(restate_server, invocation)
    assert result["status"] == "completed" and result["text"] == "hello there"
    session = http("POST", f"{restate_server.ingress_url}/{agent}/s1/session").json()
    assert [t["role"] for t in session["turns"]] == ["user", "assistant"]
    assert session["status"] == "completed"
    # A new session's creation and its first run's start are one write: the head (the session's
    # meta, the tails of its turns, its runs and its events).
    rows = restate_server.query(
        f"SELECT entry_type, name FROM sys_journal WHERE id = '{invocation}' ORDER BY index"
    )
    kinds = [r["entry_type"] for r in rows]
    first_step = next(i for i, r in enumerate(rows) if (r.get("name") or "").startswith("model:"))
    assert kinds[:first_step].count("Command: SetState") == 1, rows


def test_a_run_of_an_agent_with_an_output_ends_with_its_value(
    restate_server: RestateServer, agent_worker: Any
) -> None:
    agent = name()
    schema = {"type": "array", "items": {"type": "integer"}}
    script = [
        {"text": "1, 2, 3"},  # text only: reminded
        {"tool_calls": [{"name": "final_answer", "input": {"value": [1, 2, 3]}}]},
    ]
    agent_worker(manifest(agent, script, output={"schema": schema}))
    result = result_of(restate_server, send_run(restate_server, agent, "s1", "count"))
    assert (result["status"], result["output"], result["text"]) == (
        "completed",
        [1, 2, 3],
        "[1,2,3]",
    )
    session = http("POST", f"{restate_server.ingress_url}/{agent}/s1/session").json()
    assert session["runs"][-1]["stats"]["output"] == [1, 2, 3]


def test_two_runs_of_one_session_are_two_runs(
    restate_server: RestateServer, agent_worker: Any
) -> None:
    agent = name()
    agent_worker(manifest(agent, [{"text": "first answer"}, {"text": "second answer"}]))
    for prompt in ("one", "two"):
        response = http("POST", f"{restate_server.ingress_url}/{agent}/s1/run", {"prompt": prompt})
        assert response.status == 200, response.text
    session = http("POST", f"{restate_server.ingress_url}/{agent}/s1/session").json()
    assert [t["role"] for t in session["turns"]] == ["user", "assistant"] * 2
    run_ids = [r["id"] for r in session["runs"]]
    assert len(run_ids) == 2 and len(set(run_ids)) == 2, session["runs"]


def test_a_new_session_forks_another_after_an_answer(
    restate_server: RestateServer, agent_worker: Any
) -> None:
    agent = name()
    script = [{"text": "first answer"}, {"text": "second answer"}, {"text": "third"}]
    agent_worker(manifest(agent, script))
    ingress = restate_server.ingress_url
    for prompt in ("one", "two"):
        response = http("POST", f"{ingress}/{agent}/s1/run", {"prompt": prompt})
        assert response.status == 200, response.text
    source = http("POST", f"{ingress}/{agent}/s1/session").json()

    def run(session: str, fork: dict[str, Any]) -> Any:
        return http("POST", f"{ingress}/{agent}/{session}/run", {"prompt": "instead", "fork": fork})

    refused = run("s2", {"session": "s1", "turns": 3})  # inside the second exchange
    assert refused.status == 400 and "answers at turns: 2, 4" in refused.text, refused.text
    assert run("s1", {"session": "s0"}).status == 409  # a session that exists is not replaced
    assert run("s3", {"session": "nowhere"}).status == 404
    forked = run("s2", {"session": "s1", "turns": 2})
    assert forked.status == 200, forked.text
    assert forked.json()["text"] == "second answer"  # its second answer: the first exchange kept
    session = http("POST", f"{ingress}/{agent}/s2/session").json()
    assert [t["id"] for t in session["turns"][:2]] == [t["id"] for t in source["turns"][:2]]
    assert [t["content"][0]["text"] for t in session["turns"]] == [
        "one",
        "first answer",
        "instead",
        "second answer",
    ]
    assert session["metadata"] == {"forked_from": {"session": "s1", "turns": 2}}
    assert http("POST", f"{ingress}/{agent}/s1/session").json() == source  # it stays


def inbox_takes(server: RestateServer, agent: str) -> int:
    """The calls of the agent's inbox `take`: each an invocation of its own."""
    rows = server.query(
        f"SELECT count(*) AS n FROM sys_invocation WHERE target_service_name = '{agent}-inbox' "
        "AND target_handler_name = 'take'"
    )
    return int(rows[0]["n"])


def test_a_run_calls_its_inbox_first_and_then_only_once_a_post_rang(
    restate_server: RestateServer, agent_worker: Any
) -> None:
    agent = name()
    listing = {"tool_calls": [{"name": "list_files", "input": {}}]}
    write = {"tool_calls": [{"name": "write_file", "input": {"path": "a.txt", "content": "x"}}]}
    script = [listing, listing, {"text": "first done"}]  # run 1
    script += [listing, write, {"text": "second done"}, {"text": "noted"}]  # run 2
    tools = [
        {"name": "list_files", "builtin": "list_files"},
        {"name": "write_file", "builtin": "write_file", "requireApproval": True},
    ]
    agent_worker(manifest(agent, script, tools=tools))
    ingress = restate_server.ingress_url

    # Nothing posted: the first boundary takes (and leaves a doorbell), the answer's looks,
    # inside the answer's model step: no step of its own.
    first_run = send_run(restate_server, agent, "s1", "one")
    assert result_of(restate_server, first_run)["text"]
    assert inbox_takes(restate_server, agent) == 1
    steps = restate_server.query(
        f"SELECT name FROM sys_journal WHERE id = '{first_run}' AND entry_type = 'Command: Run'"
    )
    assert sorted(r["name"] for r in steps) == [
        "model:0:0",
        "model:1:0",
        "model:2:0",
        "timestamp",
        "tool:call_0_0",
        "tool:call_1_0",
    ]

    # Only runs take: through the ingress, `take` is refused (it would hand over the messages
    # and hang a doorbell of the caller's choosing).
    refused = http("POST", f"{ingress}/{agent}-inbox/s1/take", {"doorbell": "sign_1x"})
    assert 400 <= refused.status < 500, refused.text
    assert inbox_takes(restate_server, agent) == 1

    # A post after the run rings a doorbell whose invocation has ended, and is kept.
    first = http("POST", f"{ingress}/{agent}-inbox/s1/post", {"text": "use the blue one"})
    assert (first.status, first.json()) == (200, {"waiting": 1}), first.text

    # The next run takes it at its first boundary; one posted while it waits for an approval
    # rings the doorbell, and the run takes that one at a later boundary.
    invocation = send_run(restate_server, agent, "s1", "two")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a parked call")
    second = http("POST", f"{ingress}/{agent}-inbox/s1/post", {"text": "and keep it short"})
    assert second.status == 200, second.text
    resolve(restate_server, call["awakeable_id"], {"approved": True})
    assert result_of(restate_server, invocation)["status"] == "completed"
    session = http("POST", f"{ingress}/{agent}/s1/session").json()
    said = [
        block.get("text")
        for turn in session["turns"]
        if turn["role"] == "user"
        for block in turn["content"]
        if block["type"] == "text"
    ]
    assert said == ["one", "two", "use the blue one", "and keep it short"], said
    assert inbox_takes(restate_server, agent) == 3


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


def test_a_parked_run_cancelled_takes_its_call_out_of_the_indexes_a_killed_one_does_not(
    restate_server: RestateServer, agent_worker: Any, notify_url: str
) -> None:
    """Why the operator cancels the runs still pinned at drain.timeout, and kills only those
    that do not end: a kill runs no handler, so the parked call stays listed for good."""
    agent = name()
    agent_worker(manifest(agent, WRITE_APPROVED, approvals={"notify": {"url": notify_url}}))

    def indexed() -> set[str]:
        rows = restate_server.query(
            f"SELECT key FROM state WHERE service_name = '{agent}-parked' AND service_key = 'all'"
        )
        return {row["key"] for row in rows}

    ended = {}
    for session, how in (("s1", "cancel"), ("s2", "kill")):
        invocation = send_run(restate_server, agent, session, "write it")
        [call] = wait_until(lambda s=session: parked(restate_server, agent, s), what="parked")
        wait_until(lambda c=call: c["awakeable_id"] in indexed(), what="the index's record")
        answer = http("PATCH", f"{restate_server.admin_url}/invocations/{invocation}/{how}")
        assert answer.status in (200, 202), answer.text
        wait_until(
            lambda i=invocation: (
                restate_server.query(f"SELECT status FROM sys_invocation WHERE id = '{i}'")[0][
                    "status"
                ]
                == "completed"
            ),
            what=f"the {how}",
        )
        ended[how] = call["awakeable_id"]
    assert parked(restate_server, agent, "s1") == [] and ended["cancel"] not in indexed()
    assert parked(restate_server, agent, "s2") != [] and ended["kill"] in indexed()


def test_nothing_without_the_secret_lists_or_answers_a_parked_call(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path
) -> None:
    """The agent's tools reach Restate's ingress (they share the sidecar's network): what is
    open there must neither hand out an awakeable id nor answer a call without the webhook
    secret, which only the worker and the sidecar hold."""
    agent = name()
    agent_worker(manifest(agent, WRITE_APPROVED))
    invocation = send_run(restate_server, agent, "s1", "write it")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a parked call")
    ingress, index = restate_server.ingress_url, f"{agent}-parked/all"

    listed = http("POST", f"{ingress}/{agent}/s1/pending").json()
    assert [c["tool"] for c in listed] == ["write_file"]
    assert "awakeable_id" not in listed[0] and call["awakeable_id"] not in json.dumps(listed)
    for token in ({}, {"ts": int(time.time()), "sig": "0" * 64}, listing_token(b"not-it")):
        refused = http("POST", f"{ingress}/{index}/calls", token)
        assert refused.status != 200 and call["awakeable_id"] not in refused.text
    for step in ("add", "remove"):  # the run's own sends; not callable through the ingress
        assert http("POST", f"{ingress}/{index}/{step}", call["awakeable_id"]).status != 200

    approve: dict[str, Any] = {"value": {"approved": True}}
    for proof in ("", "0" * 64, answer_proof(b"not-it", call["awakeable_id"], approve)):
        forged = {"awakeable_id": call["awakeable_id"], **approve, "proof": proof}
        assert http("POST", f"{ingress}/{index}/answer", forged).status != 200
    assert parked(restate_server, agent, "s1") == [call]  # still waiting
    assert not (tmp_path / "out.txt").exists()

    # With the secret (as the sidecar holds it): listed with its id, and answered once.
    assert http("POST", f"{ingress}/{index}/calls", listing_token(b"s3cret")).json() == [call]
    proof = answer_proof(b"s3cret", call["awakeable_id"], approve)
    sent = {"awakeable_id": call["awakeable_id"], **approve, "proof": proof}
    assert http("POST", f"{ingress}/{index}/answer", sent).json() == {"answered": True}
    assert result_of(restate_server, invocation)["status"] == "completed"
    assert (tmp_path / "out.txt").read_text() == "yes"
    assert http("POST", f"{ingress}/{index}/calls", listing_token(b"s3cret")).json() == []


def test_during_a_rotation_the_worker_takes_either_key_from_its_sidecars(
    restate_server: RestateServer, agent_worker: Any
) -> None:
    agent = name()
    agent_worker(manifest(agent, WRITE_APPROVED), TETHER_WEBHOOK_SECRET_PREVIOUS="old-key-1234567")
    invocation = send_run(restate_server, agent, "s1", "write it")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a parked call")
    calls = f"{restate_server.ingress_url}/{agent}-parked/all/calls"

    # The index takes the call by a one-way send from the run: a moment after the session shows it.
    def listed(key: bytes) -> Any:
        return http("POST", calls, listing_token(key)).json()

    wait_until(lambda: listed(b"s3cret") == [call], what="the call in the index")
    assert listed(b"old-key-1234567") == [call]  # an old sidecar's token, as a new one's
    assert http("POST", calls, listing_token(b"another-key-12345")).status != 200
    approve: dict[str, Any] = {"value": {"approved": True}}
    proof = answer_proof(b"old-key-1234567", call["awakeable_id"], approve)
    sent = {"awakeable_id": call["awakeable_id"], **approve, "proof": proof}
    answer = f"{restate_server.ingress_url}/{agent}-parked/all/answer"
    assert http("POST", answer, sent).json() == {"answered": True}
    assert result_of(restate_server, invocation)["status"] == "completed"


def test_each_recipient_gets_links_that_name_them(
    restate_server: RestateServer, agent_worker: Any, notify_url: str
) -> None:
    agent = name()
    people = ["alice@example.com", "@bob"]
    notify = {"url": notify_url, "recipients": people}
    agent_worker(manifest(agent, WRITE_APPROVED, approvals={"notify": notify}))
    send_run(restate_server, agent, "s1", "write it")
    [note] = wait_until(lambda: Notifications.received, what="the notification")
    assert [r["to"] for r in note["recipients"]] == people
    for person in note["recipients"]:
        for action in ("approve", "deny"):
            query = parse_qs(urlsplit(person[f"{action}_url"]).query)
            assert query["to"] == [person["to"]]
            verify_link(  # signed for that person: a link without `to`, or another's, fails
                b"s3cret", action, note["awakeable_id"], query["exp"][0], query["sig"][0],
                recipient=person["to"],
            )  # fmt: skip
            with pytest.raises(SignatureError):
                verify_link(
                    b"s3cret", action, note["awakeable_id"], query["exp"][0], query["sig"][0]
                )
    assert "to=" not in note["approve_url"]  # the shared pair names no one


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


def spender(agent: str, **limits: Any) -> dict[str, Any]:
    """Calls of $0.10 at most, and each spends it: 3 tool turns and an answer; sub-agents
    allowed, so the run reserves from its budget's ledger object (`<agent>-budget`)."""
    turn = {"tool_calls": [{"name": "read", "input": {"path": "a.txt"}}]}
    usage = {"usage": {"input": 10, "output": 100}}
    script = [{**turn, **usage}] * 3 + [{"text": "done", **usage}]
    document = manifest(agent, script, limits=limits, subagents={"maxDepth": 1})
    document["spec"]["model"].update(
        maxTokens=100, pricing={"inputPerMTok": 0, "outputPerMTok": 1000}
    )
    document["spec"]["tools"] = [{"name": "read", "builtin": "read_file"}]
    return document


def test_an_exhausted_budget_parks_the_run_until_a_person_raises_it(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path, notify_url: str
) -> None:
    agent = name()
    (tmp_path / "a.txt").write_text("hi")
    document = spender(agent, maxCostUsd=0.25, onExhausted="ask")
    document["spec"]["approvals"] = {"notify": {"url": notify_url}}
    worker = agent_worker(document)
    invocation = send_run(restate_server, agent, "s1", "spend")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a parked call")
    assert (call["tool"], call["kind"], call["call_id"]) == ("budget", "approval", "budget:2:0")
    assert json.loads(call["input_summary"]) == {
        "spent": {"cost_usd": 0.2},
        "budget": {"cost_usd": 0.25},
        "next_call_at_most": {"cost_usd": 0.1},
        "raise_to": {"cost_usd": 0.5},
    }
    [note] = wait_until(lambda: Notifications.received, what="the notification")
    assert note["tool"] == "budget" and note["approve_url"]
    # Parked, the run holds no worker: a new one answers it, from the journal.
    wait_until(
        lambda: step_completed(restate_server, invocation, "notify:budget:2:0"),
        what="the notify step",
    )
    worker.kill(signal.SIGKILL)
    worker.restart()
    resolve(restate_server, call["awakeable_id"], {"approved": True, "approver": "bob"})
    result = result_of(restate_server, invocation)
    assert (result["status"], result["turns"], result["text"]) == ("completed", 4, "done")
    assert result["cost_usd"] == pytest.approx(0.4)  # no call paid twice

    def settled() -> dict[str, Any] | None:  # the last settlement is a one-way send
        rows = restate_server.query(
            f"SELECT value_utf8 FROM state WHERE service_name = '{agent}-budget' AND key = 'ledger'"
        )
        [ledger] = [json.loads(row["value_utf8"]) for row in rows]
        return None if ledger["held"] else dict(ledger)

    ledger = wait_until(settled, what="the ledger's last settlement")
    assert ledger["limits"]["cost_usd"] == 0.5
    assert ledger["spent"]["cost_usd"] == pytest.approx(0.4)
    session = http("GET", f"{restate_server.ingress_url}/{agent}/s1/session").json()
    [decision] = session["runs"][-1]["decisions"]
    assert (decision["tool"], decision["approved"], decision["approver"]) == ("budget", True, "bob")
    assert parked(restate_server, agent, "s1") == []


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


@pytest.mark.parametrize("from_spec", [False, True], ids=["environment", "spec"])
def test_a_worker_that_does_not_drain_is_stopped_after_its_graceful_timeout(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path, from_spec: bool
) -> None:
    """hypercorn waits for in-flight work on SIGTERM; a stream that never ends would keep the
    worker alive until Kubernetes kills the pod. `tether worker` ends it itself, after the
    graceful timeout its environment gives, else its spec's `worker.stopGracePeriod`."""
    (tmp_path / "stubborn_tools.py").write_text(STUBBORN_TOOL)
    agent = name()
    document = manifest(agent, [{"tool_calls": [{"name": "stubborn", "input": {}}]}])
    document["spec"]["tools"] = [{"name": "stubborn", "python": "stubborn_tools:stubborn"}]
    if from_spec:
        document["spec"]["worker"] = {"stopGracePeriod": "3s"}
    worker = agent_worker(document, TETHER_WORKER_GRACEFUL_TIMEOUT=None if from_spec else "3")
    send_run(restate_server, agent, "s1", "work")
    wait_until(lambda: (tmp_path / "stubborn.started").exists(), what="the tool to start")
    assert worker.pid is not None
    os.kill(worker.pid, signal.SIGTERM)
    started = time.monotonic()
    wait_until(lambda: worker.returncode() is not None, timeout=30, what="the worker to exit")
    assert time.monotonic() - started < 3 + 2 + 2  # graceful timeout + margin + polling
    assert worker.returncode() == 1
    assert "did not stop within its graceful timeout" in worker.log_tail()


def test_a_worker_waits_for_a_turn_of_its_spec_by_default(
    restate_server: RestateServer, agent_worker: Any
) -> None:
    """Without a graceful timeout set, `tether worker` takes the spec's: a model call and its
    longest tool call (here a shell command of up to 400 s), not hypercorn's 20 s."""
    document = manifest(name(), [{"text": "done"}])
    document["spec"]["tools"] = [
        {"name": "sh", "builtin": "shell", "config": {"timeoutSeconds": 400}}
    ]
    worker = agent_worker(document, TETHER_WORKER_GRACEFUL_TIMEOUT=None)
    arguments = Path(f"/proc/{worker.pid}/cmdline").read_bytes().split(b"\0")
    assert Path(arguments[2].decode()).name == "deadline.py", arguments
    expected = stop_grace_seconds(parse_agent(document).spec)
    assert float(arguments[3]) == pytest.approx(expected)
    assert expected > 400


PATH_TOKEN = "T0kenInThePath0123456789abcdef"
"""The secret part of a notify URL (a Slack incoming webhook's path is its token)."""


class Failing(BaseHTTPRequestHandler):
    """A notify endpoint that answers every POST with HTTP 500."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(500)
        self.send_header("content-length", "0")
        self.end_headers()


@pytest.fixture
def failing_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def whole_log(worker: HypercornWorker) -> str:
    return worker.log_path.read_text(errors="replace")


@pytest.mark.parametrize(
    ("source", "endpoint", "outcome"),
    [
        ("urlSecretRef", "closed port", "failed: ConnectError"),
        ("url", "closed port", "failed: ConnectError"),
        ("urlSecretRef", "HTTP 500", "answered HTTP 500"),
    ],
)
def test_a_failed_notification_is_logged_by_its_host_without_the_token(
    restate_server: RestateServer,
    agent_worker: Any,
    failing_port: int,
    source: str,
    endpoint: str,
    outcome: str,
) -> None:
    """The worker logs a notification it could not deliver, naming the host only: the URL
    (from the Secret, through TETHER_NOTIFY_URL, or a plain `url`) never shows in its log."""
    port = failing_port if endpoint == "HTTP 500" else free_port()
    url = f"http://127.0.0.1:{port}/services/T0AAAAAAA/B0BBBBBBB/{PATH_TOKEN}"
    agent = name()
    if source == "url":
        document, env = manifest(agent, WRITE_APPROVED, approvals={"notify": {"url": url}}), {}
    else:
        notify = {"urlSecretRef": {"name": "slack", "key": "url"}}
        document = manifest(agent, WRITE_APPROVED, approvals={"notify": notify})
        env = {"TETHER_NOTIFY_URL": url}
    worker = agent_worker(document, **env)
    invocation = send_run(restate_server, agent, "s1", "write it")
    [call] = wait_until(lambda: parked(restate_server, agent, "s1"), what="a parked call")
    wait_until(
        lambda: step_completed(restate_server, invocation, "notify:"), what="the notify step"
    )
    noted = "approval notification to"
    wait_until(lambda: noted in whole_log(worker), timeout=10, what=f"{noted!r} in the log")
    log = whole_log(worker)
    assert PATH_TOKEN not in log and "/services/" not in log, log
    assert f"approval notification to 127.0.0.1:{port} {outcome}" in log, log
    resolve(restate_server, call["awakeable_id"], True)
    assert result_of(restate_server, invocation)["status"] == "completed"


CHATTY_TOOL = """
import logging
import os

from tether import tool


@tool
async def chatty() -> str:
    \"\"\"Logs what careless code logs.\"\"\"
    logging.getLogger("chatty").warning(
        "posting to %s with Authorization: Bearer %s (secret %s, key %s)",
        os.environ["TETHER_NOTIFY_URL"],
        os.environ["TETHER_WEBHOOK_SECRET"],
        os.environ["TETHER_WEBHOOK_SECRET"],
        os.environ["ANTHROPIC_API_KEY"],
    )
    return "logged"
"""


def test_the_worker_redacts_every_line_it_logs(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path
) -> None:
    """The redaction filter runs in the worker's processes: a line that a tool (or a library)
    logs keeps the scheme and host of a URL and loses the rest, tokens and known secrets."""
    (tmp_path / "chatty_tools.py").write_text(CHATTY_TOOL)
    agent = name()
    document = manifest(agent, [{"tool_calls": [{"name": "chatty", "input": {}}]}, {"text": "ok"}])
    document["spec"]["tools"] = [{"name": "chatty", "python": "chatty_tools:chatty"}]
    url = f"https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/{PATH_TOKEN}"
    api_key = "sk-ant-api03-n0tReaLbutL0ngEnough"
    worker = agent_worker(document, TETHER_NOTIFY_URL=url, ANTHROPIC_API_KEY=api_key)
    response = http("POST", f"{restate_server.ingress_url}/{agent}/s1/run", {"prompt": "log"})
    assert response.status == 200 and response.json()["status"] == "completed", response.text
    wait_until(lambda: "posting to" in whole_log(worker), timeout=10, what="the tool's line")
    log = whole_log(worker)
    for secret in (PATH_TOKEN, "s3cret", api_key):
        assert secret not in log, log
    line = "posting to https://hooks.slack.com/[redacted] with Authorization: Bearer [redacted]"
    assert line in log, log


def test_a_shell_command_cannot_read_the_secrets_of_the_worker_processes(
    restate_server: RestateServer, agent_worker: Any
) -> None:
    """The agent's `shell` runs as the worker's user. Every process of the worker holds the
    webhook secret and the model keys in its environment (`tether worker`, PID 1 of a pod, as
    `tether.programs.worker.deadline`; the hypercorn master; its worker child) or ran without them
    (the resource tracker): a command reads none of them from `/proc/<pid>/environ` or `mem`."""
    secret, key = secrets.token_hex(16), secrets.token_hex(16)
    agent = name()
    probe = "cat /proc/$PPID/environ; echo; cat /proc/1/environ; echo; "
    probe += f"{sys.executable} {PROC_PROBE} {os.getpid()}"
    script = [{"tool_calls": [{"name": "sh", "input": {"command": probe}}]}, {"text": "done"}]
    document = manifest(agent, script)
    # Without the sandbox (a kernel without Landlock; the probe is this Python, outside it).
    shell = {
        "maxOutputBytes": 4 * 1024 * 1024,
        "timeoutSeconds": 120,
        "sandbox": {"enabled": False},
    }
    document["spec"]["tools"] = [{"name": "sh", "builtin": "shell", "config": shell}]
    # Same uid as the tests, no capabilities: what the worker's own user is in a pod.
    env = {"TETHER_WEBHOOK_SECRET": secret, "ANTHROPIC_API_KEY": key}
    worker = agent_worker(document, prefix=without_capabilities(), **env)
    response = http("POST", f"{restate_server.ingress_url}/{agent}/s1/run", {"prompt": "look"})
    assert response.status == 200, response.text
    turns = http("POST", f"{restate_server.ingress_url}/{agent}/s1/session").json()["turns"]
    [output] = [
        str(block["content"])
        for turn in turns
        for block in turn["content"]
        if block["type"] == "tool_result"
    ]
    assert "probe done" in output, output
    assert "self CapEff:\t0000000000000000" in output, output  # nothing that bypasses the check
    assert secret not in output and key not in output, output
    # Up from the command's own `sh -c`: the hypercorn child, its master, and `tether worker`
    # (deadline), each of which the probe could read neither the environment nor the memory of.
    ancestors = re.findall(r"^ancestor (\d+): (.*)\n  (.*)\n  (.*)$", output, re.MULTILINE)
    assert ancestors[0][1].startswith("/bin/sh -c "), output
    workers = {pid: (command, read) for pid, command, *read in ancestors[1:]}
    assert str(worker.pid) in workers, output
    for needle in ("multiprocessing.spawn", "-m hypercorn", "deadline.py"):
        assert any(needle in command for command, _ in workers.values()), output
    denied = ["environ: cannot read (Permission denied)", "memory: cannot read (Permission denied)"]
    assert all(read == denied for _, read in workers.values()), output


DISCOVER = {"accept": "application/vnd.restate.endpointmanifest.v4+json"}


def restate_jwt(private_pem: bytes, path: str, *, kid: str) -> dict[str, str]:
    """The headers Restate signs a request to a deployment with (scheme v1: an EdDSA JWT whose
    audience is the request's path), made here with any key."""
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    def part(data: dict[str, Any]) -> str:
        encoded = json.dumps(data, separators=(",", ":")).encode()
        return base64.urlsafe_b64encode(encoded).rstrip(b"=").decode()

    now = int(time.time())
    claims = {"aud": path, "nbf": now - 60, "iat": now, "exp": now + 60}
    signing_input = f"{part({'typ': 'JWT', 'alg': 'EdDSA', 'kid': kid})}.{part(claims)}"
    key = load_pem_private_key(private_pem, password=None)
    signature = key.sign(signing_input.encode())  # type: ignore[union-attr, call-arg]
    token = f"{signing_input}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"
    return {"x-restate-signature-scheme": "v1", "x-restate-jwt-v1": token}


def test_only_restate_can_invoke_the_worker(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path
) -> None:
    """Anything else that reaches the worker's port (another pod; the agent's own `shell` over
    loopback) could invoke its handlers with a journal of its own, one that says a call was
    approved. The worker takes only requests Restate signed (tether.programs.restate_identity)."""
    agent = "signed-only"
    worker = agent_worker(manifest(agent, [{"text": "hello"}]))  # registered: Restate signs
    assert result_of(restate_server, send_run(restate_server, agent, "s1", "hi"))["text"] == "hello"

    invoke = f"/invoke/{agent}/run"
    forged_key = new_private_key_pem()
    for path, headers in [
        ("/discover", {}),
        (invoke, {"content-type": "application/vnd.restate.invocation.v5"}),
        ("/discover", restate_jwt(forged_key, "/discover", kid=public_key_of(forged_key))),
        # A key of its own, named as Restate's: still not Restate's signature.
        ("/discover", restate_jwt(forged_key, "/discover", kid=restate_server.identity_public_key)),
    ]:
        response = http(
            "POST" if path == invoke else "GET", worker.url + path, raw=b"", headers=headers
        )
        assert response.status == 401, (path, headers, response.status)
    assert http("GET", f"{worker.url}/health").status == 200

    # The check is the signature: one made with Restate's own key passes.
    restate_key = (restate_server.base_dir / IDENTITY_KEY_FILE).read_bytes()
    signed = restate_jwt(restate_key, "/discover", kid=restate_server.identity_public_key)
    assert http("GET", f"{worker.url}/discover", headers={**DISCOVER, **signed}).status == 200

    # Without the keys (the setting unset), a worker takes anything, and says so at start.
    open_worker = agent_worker(
        manifest("unsigned", [{"text": "hi"}]), TETHER_RESTATE_IDENTITY_KEYS=""
    )
    assert http("GET", f"{open_worker.url}/discover", headers=DISCOVER).status == 200
    assert "accepts requests that Restate did not sign" in open_worker.log_tail()


def test_a_model_that_fails_hands_the_turn_to_its_fallback_and_a_replay_asks_no_model_again(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path, model_server: ModelServer
) -> None:
    # Real SDK clients of both providers (Anthropic's first, OpenAI's its fallback) against one
    # server of both wire formats: a request's path says which model it went to.
    model_server.script(
        ErrorReply(529, "Overloaded", "overloaded_error"),
        Reply(tool_calls=[ToolCall("shell", {"command": "echo started > marker; sleep 3"})]),
        Reply(text=["done"]),
    )
    agent = name()
    document = manifest(agent, [])
    document["spec"]["model"] = two_models(model_server)
    document["spec"]["tools"] = [{"name": "shell", "builtin": "shell", "replay": "safe"}]
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    keys = {"ANTHROPIC_API_KEY": "a-key", "OPENAI_API_KEY": "o-key"}
    worker = agent_worker(document, PROMETHEUS_MULTIPROC_DIR=str(metrics), **keys)
    invocation = send_run(restate_server, agent, "s1", "work")
    wait_until(lambda: (tmp_path / "marker").exists(), what="the tool to start")
    worker.kill(signal.SIGKILL)  # the fallback's answer is journaled; the tool is cut off
    worker.restart()
    result = result_of(restate_server, invocation)
    assert (result["status"], result["text"]) == ("completed", "done")
    paths = [r.path.rsplit("/", 1)[-1] for r in model_server.requests]
    assert paths == ["messages", "completions", "messages"]  # none asked twice
    keys_sent = [
        (r.headers.get("x-api-key") or r.headers["authorization"]).removeprefix("Bearer ")
        for r in model_server.requests
    ]
    assert keys_sent == ["a-key", "o-key", "a-key"]  # each model its own key

    assert model_calls(metrics, agent) == {
        ("claude-test", "ok"): 1,
        ("claude-test", "error"): 1,
        ("claude-test", "skipped"): 0,
        ("claude-test", "capped"): 0,
        ("gpt-test", "ok"): 1,
        ("gpt-test", "error"): 0,
        ("gpt-test", "skipped"): 0,
        ("gpt-test", "capped"): 0,
    }


def model_calls(metrics: Path, agent: str) -> dict[tuple[str, str], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics))
    return {
        (s.labels["model"], s.labels["outcome"]): s.value
        for family in registry.collect()
        if family.name == "tether_model_calls"
        for s in family.samples
        if s.name == "tether_model_calls_total" and s.labels["agent"] == agent
    }


def waiting_calls(metrics: Path, agent: str) -> float:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics))
    return sum(
        s.value
        for family in registry.collect()
        if family.name == "tether_model_calls_waiting"
        for s in family.samples
        if s.labels["agent"] == agent
    )


def test_a_workers_calls_past_its_models_cap_wait_for_a_slot(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path, model_server: ModelServer
) -> None:
    held = Reply(text=["first"], hold_after=0)
    model_server.script(held, Reply(text=["second"]))
    agent = name()
    document = manifest(agent, [])
    document["spec"]["model"] = one_model(model_server, maxConcurrentCalls=1)
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    agent_worker(document, PROMETHEUS_MULTIPROC_DIR=str(metrics), ANTHROPIC_API_KEY="a-key")
    first = send_run(restate_server, agent, "s1", "one")
    wait_until(lambda: len(model_server.requests) == 1, what="the first call")
    second = send_run(restate_server, agent, "s2", "two")
    try:
        wait_until(lambda: waiting_calls(metrics, agent) == 1, what="the second call to wait")
        assert len(model_server.requests) == 1  # not sent while the first is in flight
    finally:
        held.release.set()
    texts = {result_of(restate_server, i)["text"] for i in (first, second)}
    assert texts == {"first", "second"} and len(model_server.requests) == 2
    assert waiting_calls(metrics, agent) == 0


def test_a_model_that_failed_is_skipped_by_the_workers_next_runs_while_it_cools_down(
    restate_server: RestateServer, agent_worker: Any, tmp_path: Path, model_server: ModelServer
) -> None:
    model_server.script(
        ErrorReply(529, "Overloaded", "overloaded_error"),
        Reply(text=["one"]),
        Reply(text=["two"]),  # the next run's: the fallback's at once
    )
    agent = name()
    document = manifest(agent, [])
    document["spec"]["model"] = two_models(model_server, cooldown={"failures": 1, "duration": "1h"})
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    keys = {"ANTHROPIC_API_KEY": "a-key", "OPENAI_API_KEY": "o-key"}
    agent_worker(document, PROMETHEUS_MULTIPROC_DIR=str(metrics), **keys)
    for session, text in (("s1", "one"), ("s2", "two")):
        result = result_of(restate_server, send_run(restate_server, agent, session, "hi"))
        assert (result["status"], result["text"]) == ("completed", text)
    paths = [r.path.rsplit("/", 1)[-1] for r in model_server.requests]
    assert paths == ["messages", "completions", "completions"]
    calls = model_calls(metrics, agent)
    assert (calls[("claude-test", "error")], calls[("claude-test", "skipped")]) == (1, 1)
    assert calls[("gpt-test", "ok")] == 2


def test_a_named_sub_agent_runs_on_its_own_model_and_answers_with_its_output(
    restate_server: RestateServer, agent_worker: Any, model_server: ModelServer
) -> None:
    task = {"task": "check the change", "agent": "reviewer"}
    model_server.script(
        Reply(tool_calls=[ToolCall("spawn", task)]),  # the agent, on its first model
        Reply(tool_calls=[ToolCall("final_answer", {"ok": True})]),  # the reviewer, on its own
        Reply(text=["shipped"]),
    )
    agent = name()
    document = manifest(agent, [])
    document["spec"]["model"] = two_models(model_server)
    document["spec"]["subagents"] = {
        "maxDepth": 1,
        "agents": [
            {
                "name": "reviewer",
                "description": "Reviews a change.",
                "system": "You review changes.",
                "tools": [],
                "model": "gpt-test",
                "output": {"schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}},
            }
        ],
    }
    agent_worker(document, ANTHROPIC_API_KEY="a-key", OPENAI_API_KEY="o-key")
    result = result_of(restate_server, send_run(restate_server, agent, "s1", "ship it"))
    assert (result["status"], result["text"]) == ("completed", "shipped")
    first, child, last = model_server.requests
    assert [r.path.rsplit("/", 1)[-1] for r in (first, child, last)] == [
        "messages",
        "completions",
        "messages",
    ]
    [spawn] = [t for t in first.body["tools"] if t["name"] == "spawn"]
    assert spawn["input_schema"]["properties"]["agent"]["enum"] == ["reviewer"]
    assert child.body["messages"][0] == {"role": "system", "content": "You review changes."}
    assert [t["function"]["name"] for t in child.body["tools"]] == ["final_answer"]
    session = http("GET", f"{restate_server.ingress_url}/{agent}/s1/session").json()
    [answer] = [b for b in session["turns"][2]["content"] if b["type"] == "tool_result"]
    assert answer["content"] == '{"ok":true}'


def test_a_named_sub_agents_own_sub_agents_never_get_a_tool_it_lacks(
    restate_server: RestateServer, agent_worker: Any, model_server: ModelServer, tmp_path: Path
) -> None:
    model_server.script(
        Reply(tool_calls=[ToolCall("spawn", {"task": "read it", "agent": "reader"})]),
        Reply(tool_calls=[ToolCall("spawn", {"task": "now run this"})]),  # the reader: a copy
        Reply(tool_calls=[ToolCall("shell", {"command": "touch escaped"})]),  # the copy tries
        Reply(text=["no shell here"]),
        Reply(text=["read"]),
        Reply(text=["done"]),
    )
    agent = name()
    document = manifest(agent, [])
    document["spec"]["model"] = one_model(model_server)
    document["spec"]["tools"] = [
        {"name": "read", "builtin": "read_file"},
        {"name": "shell", "builtin": "shell"},
    ]
    reader = {"name": "reader", "description": "Reads untrusted files.", "tools": ["read"]}
    document["spec"]["subagents"] = {"maxDepth": 2, "agents": [reader]}
    agent_worker(document, ANTHROPIC_API_KEY="a-key")
    result = result_of(restate_server, send_run(restate_server, agent, "s1", "go"))
    assert (result["status"], result["text"]) == ("completed", "done")
    tools = [sorted(t["name"] for t in r.body["tools"]) for r in model_server.requests]
    assert tools[:3] == [["read", "shell", "spawn"], ["read", "spawn"], ["read"]]
    assert not (tmp_path / "escaped").exists()
