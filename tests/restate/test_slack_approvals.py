"""Approvals from Slack, and resolutions signed with Standard Webhooks, through the real stack:
a real restate-server and `tether worker` (`DevStack`), and two `tether sidecar` replicas that
reach Restate's ingress through a counting proxy (so a test proves a refused request never got
there as an answer).

`FakeSlack` speaks Slack's wire format on both sides: it is the incoming webhook the worker posts
its Block Kit message to, it plays Slack by sending a button's interaction to a sidecar (a form
with a `payload`, signed `v0` with the app's signing secret, as Slack documents), and it is the
`response_url` the sidecar updates the message through.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx2
import pytest
import yaml
from standardwebhooks import Webhook

from tests.restate.support import approval_manifest, wait_until
from tests.restate.test_sidecar_restate import CountingProxy, SidecarProcess
from tether.programs.dev import DevStack
from tether.programs.sidecar.context import delivery_key
from tether.programs.webhooks import sign_request, standard_webhooks_secret
from tether.testing import dump_logs_if_failed

AGENT = "slacked"
SECRET = "the-webhook-secret-of-the-slack-tests"
SIGNING_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
HOOK_TOKEN = "xT0kenOfTheIncomingWebhook0"
SCRIPT = [
    {"tool_calls": [{"name": "write_file", "input": {"path": "out.txt", "content": "yes"}}]},
    {"text": "done"},
]
ALICE = {"id": "U0ALICE", "username": "alice", "name": "alice", "team_id": "T0TETHER"}
BOB = {"id": "U0BOB", "username": "bob", "name": "bob", "team_id": "T0TETHER"}
TIMEOUT = 120.0  # generous: other suites share the two cores


# --------------------------------------------------------------------------------------------
# Slack on loopback


class FakeSlack:
    """The incoming webhook (`/services/...`), the `response_url`s (`/actions/<n>`), and the
    clicks, sent to a sidecar as Slack sends them."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.responses: dict[str, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._clicks = itertools.count(1)
        slack = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length))
                with slack._lock:
                    if self.path.startswith("/services/"):
                        slack.messages.append(body)
                    else:
                        slack.responses.setdefault(self.path, []).append(body)
                self.send_response(200)  # Slack answers "ok"
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def webhook_url(self) -> str:
        return f"{self.url}/services/T0TETHER/B0TETHER/{HOOK_TOKEN}"

    def message_for(self, session: str) -> dict[str, Any]:
        """The approval message of the call parked in `session` (waits for it)."""

        def posted() -> dict[str, Any] | None:
            with self._lock:
                return next((m for m in self.messages if f"`{session}`" in json.dumps(m)), None)

        return wait_until(posted, timeout=TIMEOUT, what=f"the Slack message of {session}")

    def responses_to(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.responses.get(path, []))

    def wait_response(self, path: str) -> dict[str, Any]:
        [response] = wait_until(
            lambda: self.responses_to(path), timeout=TIMEOUT, what=f"the reply to {path}"
        )
        return response

    def click(
        self,
        sidecar: str,
        message: dict[str, Any],
        action_id: str,
        *,
        user: dict[str, str] = ALICE,
        value: str | None = None,
        age: int = 0,
        signing_secret: str = SIGNING_SECRET,
    ) -> Click:
        """Press the button `action_id` of `message` as `user`: the interaction Slack sends to
        the app's request URL (`value` replaces the button's, `age` seconds back-dates it)."""
        [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
        [button] = [e for e in actions["elements"] if e["action_id"] == action_id]
        response_path = f"/actions/T0TETHER/{next(self._clicks)}/r3sp0nseT0ken"
        payload = {
            "type": "block_actions",
            "user": user,
            "api_app_id": "A0TETHER",
            "token": "legacy-verification-token",
            "container": {"type": "message", "message_ts": "1.2", "channel_id": "C0APPROVE"},
            "trigger_id": "1.2.3",
            "team": {"id": "T0TETHER", "domain": "acme"},
            "channel": {"id": "C0APPROVE", "name": "approvals"},
            "message": {"type": "message", "ts": "1.2", "text": message["text"], **message},
            "response_url": self.url + response_path,
            "actions": [
                {
                    "type": "button",
                    "action_id": action_id,
                    "block_id": actions["block_id"],
                    "text": button["text"],
                    "value": button["value"] if value is None else value,
                    "style": button.get("style"),
                    "action_ts": "1.3",
                }
            ],
        }
        body = urlencode({"payload": json.dumps(payload)}).encode()
        stamp = str(int(time.time()) - age)
        signature = hmac.new(
            signing_secret.encode(), f"v0:{stamp}:".encode() + body, hashlib.sha256
        ).hexdigest()
        headers = {
            "content-type": "application/x-www-form-urlencoded",
            "x-slack-request-timestamp": stamp,
            "x-slack-signature": f"v0={signature}",
        }
        sent = httpx2.post(
            f"{sidecar}/v1/slack/interactions", content=body, headers=headers, timeout=60
        )
        return Click(sent, response_path)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


@dataclass(frozen=True)
class Click:
    response: httpx2.Response
    response_path: str
    """Where the sidecar's reply to this click goes (its `response_url`)."""


def button(message: dict[str, Any], action_id: str) -> dict[str, Any]:
    [actions] = [b for b in message["blocks"] if b["type"] == "actions"]
    found: dict[str, Any] = next(e for e in actions["elements"] if e["action_id"] == action_id)
    return found


# --------------------------------------------------------------------------------------------
# The stack


@dataclass
class Stack:
    dev: DevStack
    slack: FakeSlack
    proxy: CountingProxy
    sidecars: tuple[SidecarProcess, SidecarProcess]
    workspace: Path

    @property
    def urls(self) -> tuple[str, str]:
        return self.sidecars[0].url, self.sidecars[1].url

    def start_run(self, session: str) -> str:
        url = f"{self.dev.server.ingress_url}/{AGENT}/{session}/run/send"
        response = httpx2.post(url, json={"prompt": "write it"}, timeout=30)
        assert response.status_code == 202, response.text
        invocation: str = response.json()["invocationId"]
        return invocation

    def result(self, invocation: str) -> dict[str, Any]:
        url = f"{self.dev.server.ingress_url}/restate/invocation/{invocation}/attach"
        response = httpx2.get(url, timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()
        return result

    def decisions(self, session: str) -> list[dict[str, Any]]:
        url = f"{self.dev.server.ingress_url}/{AGENT}/{session}/session"
        runs = httpx2.post(url, timeout=30).json()["runs"]
        decisions: list[dict[str, Any]] = runs[-1]["decisions"]
        return decisions

    def parked(self, session: str, replica: int = 0) -> dict[str, Any] | None:
        headers = sign_request(SECRET.encode(), b"", path="/v1/approvals")
        listed = httpx2.get(f"{self.urls[replica]}/v1/approvals", headers=headers, timeout=30)
        assert listed.status_code == 200, listed.text
        return next((p for p in listed.json()["parked"] if p["session"] == session), None)

    def park(self, session: str) -> tuple[str, str, dict[str, Any]]:
        """A run parked on its approval: (invocation id, awakeable id, its Slack message)."""
        invocation = self.start_run(session)
        call = wait_until(
            lambda: self.parked(session), timeout=TIMEOUT, what=f"the parked call of {session}"
        )
        return invocation, call["awakeable_id"], self.slack.message_for(session)

    def answers(self) -> int:
        """How many answers the proxy forwarded to Restate (to any call)."""
        return len(self.proxy.all_completions())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    base = tmp_path_factory.mktemp("slack")
    workspace = base / "workspace"
    workspace.mkdir()
    manifest = approval_manifest(base, AGENT, SCRIPT)
    document = yaml.safe_load(manifest.read_text())
    document["spec"]["approvals"] = {
        "notify": {
            "format": "slack",
            "urlSecretRef": {"name": "slack", "key": "incoming-webhook"},
            "slackSigningSecretRef": {"name": "slack", "key": "signing-secret"},
        }
    }
    manifest.write_text(yaml.safe_dump(document))
    slack = FakeSlack()
    logs = Path(tempfile.mkdtemp(prefix="tether-slack-"))
    sidecars: list[SidecarProcess] = []
    proxy: CountingProxy | None = None
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TETHER_WORKSPACE", str(workspace))
        env.setenv("TETHER_WEBHOOK_SECRET", SECRET)
        env.setenv("TETHER_NOTIFY_URL", slack.webhook_url)  # from the Secret, on Kubernetes
        env.setenv("TETHER_SLACK_SIGNING_SECRET", SIGNING_SECRET)
        env.setenv("TETHER_SLACK_RESPONSE_URL_PREFIX", slack.url + "/actions/")
        dev = DevStack(manifest, base / "dev")
        try:
            with dev:
                proxy = CountingProxy(dev.server.ingress_url)
                for number in (1, 2):
                    sidecar = SidecarProcess(
                        {"RESTATE_INGRESS_URL": proxy.url, "TETHER_AGENT": AGENT},
                        logs / f"sidecar-{number}.log",
                    )
                    sidecars.append(sidecar)
                    sidecar.wait_ready()
                yield Stack(dev, slack, proxy, (sidecars[0], sidecars[1]), workspace)
        finally:
            for sidecar in sidecars:
                sidecar.close()
            if proxy is not None:
                proxy.close()
            slack.close()
            shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture(autouse=True)
def logs_of_a_failure(stack: Stack, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    dump_logs_if_failed(
        request,
        {
            "worker log": lambda: stack.dev.worker.log.read_text(errors="replace")[-6000:],
            "sidecar 1 log": lambda: stack.sidecars[0].log()[-6000:],
            "sidecar 2 log": lambda: stack.sidecars[1].log()[-6000:],
        },
    )


# --------------------------------------------------------------------------------------------
# Slack


def test_the_message_shows_the_call_and_a_click_approves_it_once(stack: Stack) -> None:
    one, other = stack.urls
    invocation, awakeable_id, message = stack.park("approve-in-slack")

    # The message: the call, its input, the deadline, and two buttons that hold no awakeable id.
    text = json.dumps(message)
    assert message["blocks"][0]["text"]["text"] == "Approval needed: write_file"
    assert f"*Agent*\\n{AGENT}" in text and "*Session*\\n`approve-in-slack`" in text
    assert '\\"path\\": \\"out.txt\\"' in text and "*Times out*\\n<!date^" in text
    approve, deny = button(message, "tether:approve"), button(message, "tether:deny")
    assert (approve["style"], approve["text"]["text"]) == ("primary", "Approve")
    assert (deny["style"], deny["text"]["text"]) == ("danger", "Deny")
    assert awakeable_id not in text
    assert HOOK_TOKEN not in stack.dev.worker.log.read_text()  # the URL is a credential

    clicked = stack.slack.click(one, message, "tether:approve", user=ALICE)
    assert clicked.response.status_code == 200, clicked.response.text
    assert clicked.response.json() == {"outcome": "approved", "approver": "@alice (U0ALICE)"}
    assert stack.result(invocation)["status"] == "completed"
    assert (stack.workspace / "out.txt").read_text() == "yes"
    [decision] = stack.decisions("approve-in-slack")
    assert decision["tool"] == "write_file" and decision["approved"] is True
    assert (decision["by"], decision["approver"]) == ("slack", "@alice (U0ALICE)")
    assert abs(decision["decided_at"] / 1000 - time.time()) < TIMEOUT
    assert stack.proxy.completions(awakeable_id) == ["resolve"]

    # The message is replaced: the same call, its buttons now say who decided.
    update = stack.slack.wait_response(clicked.response_path)
    assert update["replace_original"] is True and update["text"] == "Approved by @alice"
    kinds = [block["type"] for block in update["blocks"]]
    assert "actions" not in kinds and kinds.count("header") == 1
    assert "*Approved by @alice*" in json.dumps(update) and "out.txt" in json.dumps(update)

    # A second click, on the same replica: told who decided, nothing sent to Restate.
    again = stack.slack.click(one, message, "tether:deny", user=BOB)
    assert again.response.status_code == 200, again.response.text
    assert again.response.json()["outcome"] == "already_resolved"
    reply = stack.slack.wait_response(again.response_path)
    assert reply["response_type"] == "ephemeral" and reply["replace_original"] is False
    assert "already answered (approved by @alice in Slack)" in reply["text"]
    assert "your click changed nothing" in reply["text"]

    # And on the other replica, once the run has let go of the call: no longer waiting.
    wait_until(
        lambda: stack.parked("approve-in-slack", replica=1) is None,
        timeout=TIMEOUT,
        what="the call to leave the index",
    )
    late = stack.slack.click(other, message, "tether:approve", user=BOB)
    assert late.response.status_code == 200, late.response.text
    assert late.response.json()["outcome"] == "unknown_id"
    assert "no longer waiting" in stack.slack.wait_response(late.response_path)["text"]
    assert stack.proxy.completions(awakeable_id) == ["resolve"]
    assert [d["approver"] for d in stack.decisions("approve-in-slack")] == ["@alice (U0ALICE)"]


def test_a_deny_click_denies_and_the_tool_never_runs(stack: Stack) -> None:
    (stack.workspace / "out.txt").unlink(missing_ok=True)
    invocation, awakeable_id, message = stack.park("deny-in-slack")
    clicked = stack.slack.click(stack.urls[1], message, "tether:deny", user=BOB)
    assert clicked.response.status_code == 200, clicked.response.text
    assert stack.result(invocation)["status"] == "completed"
    assert not (stack.workspace / "out.txt").exists()
    [decision] = stack.decisions("deny-in-slack")
    assert (decision["approved"], decision["approver"]) == (False, "@bob (U0BOB)")
    update = stack.slack.wait_response(clicked.response_path)
    assert update["text"] == "Denied by @bob" and "actions" not in json.dumps(update["blocks"])
    assert stack.proxy.completions(awakeable_id) == ["resolve"]


def test_a_forged_or_stale_click_is_refused_and_reaches_nothing(stack: Stack) -> None:
    one, other = stack.urls
    invocation, awakeable_id, message = stack.park("forged-in-slack")
    answers = stack.answers()
    refused = {
        "forged signature": stack.slack.click(
            one, message, "tether:approve", signing_secret="not-the-apps-signing-secret"
        ),
        "six minutes old": stack.slack.click(other, message, "tether:approve", age=360),
    }
    for what, click in refused.items():
        assert click.response.status_code == 401, (what, click.response.text)
    assert refused["forged signature"].response.json() == {
        "error": "not authenticated: X-Slack-Signature does not match",
        "outcome": "bad_signature",
    }
    assert refused["six minutes old"].response.json()["outcome"] == "expired"
    assert "outside the accepted window" in refused["six minutes old"].response.json()["error"]
    tampered = httpx2.post(  # signed, then changed on the way
        f"{one}/v1/slack/interactions",
        content=b"payload=%7B%7D",
        headers={
            "content-type": "application/x-www-form-urlencoded",
            "x-slack-request-timestamp": str(int(time.time())),
            "x-slack-signature": "v0=" + "0" * 64,
        },
        timeout=30,
    )
    assert tampered.status_code == 401, tampered.text

    # Nothing was answered, no reply went anywhere, and the call still waits.
    assert stack.answers() == answers
    assert all(stack.slack.responses_to(c.response_path) == [] for c in refused.values())
    assert stack.parked("forged-in-slack") is not None
    done = stack.slack.click(one, message, "tether:approve")  # the real click still works
    assert done.response.status_code == 200, done.response.text
    assert stack.result(invocation)["status"] == "completed"
    assert stack.proxy.completions(awakeable_id) == ["resolve"]


def test_a_token_for_another_call_is_refused(stack: Stack) -> None:
    one, other = stack.urls
    first, first_id, first_message = stack.park("token-one")
    second, second_id, second_message = stack.park("token-two")
    answers = stack.answers()
    token = json.loads(button(first_message, "tether:approve")["value"])
    assert token["call"] == json.loads(button(second_message, "tether:approve")["value"])["call"]
    forgeries = {
        # the first call's signature, naming the second call (the same call id, another park)
        "another call": json.dumps({**token, "session": "token-two"}),
        "a later deadline": json.dumps({**token, "exp": token["exp"] + 86_400}),
        "the deny button's token": button(first_message, "tether:deny")["value"],
        "no token": "approve",
    }
    replies = {}
    for number, (what, value) in enumerate(forgeries.items()):
        click = stack.slack.click(
            (one, other)[number % 2], second_message, "tether:approve", value=value
        )
        assert click.response.status_code == 403, (what, click.response.text)
        assert click.response.json()["outcome"] == "bad_token", what
        replies[what] = stack.slack.wait_response(click.response_path)
        assert replies[what]["response_type"] == "ephemeral", what
        assert replies[what]["text"].startswith("Refused: "), (what, replies[what])
    assert "was not made for this call" in replies["another call"]["text"]
    assert "for the other button" in replies["the deny button's token"]["text"]
    assert stack.answers() == answers
    assert stack.parked("token-one") is not None and stack.parked("token-two") is not None

    for invocation, message in ((first, first_message), (second, second_message)):
        done = stack.slack.click(other, message, "tether:approve")
        assert done.response.status_code == 200, done.response.text
        assert stack.result(invocation)["status"] == "completed"
    assert stack.proxy.completions(first_id) == stack.proxy.completions(second_id) == ["resolve"]


# --------------------------------------------------------------------------------------------
# Standard Webhooks


def standard_webhook(
    key: str, value: Any, msg_id: str, *, age: float = 0
) -> tuple[bytes, dict[str, str]]:
    """A delivery as a Standard Webhooks sender makes it, signed by the reference package."""
    body = json.dumps(value)
    stamp = datetime.fromtimestamp(time.time() - age, UTC)
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(stamp.timestamp())),
        "webhook-signature": Webhook(key).sign(msg_id, stamp, body),
    }
    return body.encode(), headers


def test_a_standard_webhooks_delivery_resolves_once(stack: Stack) -> None:
    one, other = stack.urls
    key = standard_webhooks_secret(SECRET.encode())
    assert key == "whsec_" + base64.b64encode(SECRET.encode()).decode()  # as documented
    invocation, awakeable_id, _ = stack.park("standard-one")
    next_invocation, next_id, _ = stack.park("standard-two")
    path = f"/v1/awakeables/{awakeable_id}/resolve"
    body, headers = standard_webhook(key, {"approved": True, "approver": "ci-bot"}, "msg_one")

    sent = httpx2.post(one + path, content=body, headers=headers, timeout=60)
    assert sent.status_code == 202, sent.text
    assert stack.result(invocation)["status"] == "completed"
    [decision] = stack.decisions("standard-one")
    assert (decision["approved"], decision["approver"]) == (True, "ci-bot")
    answers = stack.answers()

    # The same delivery again: to the same replica, to the other one, and, since its signature
    # does not cover the path, to the other parked call on either: refused every time.
    replays = {
        "same replica, same call": one + path,
        "other replica, other call": f"{other}/v1/awakeables/{next_id}/resolve",
        "same replica, other call": f"{one}/v1/awakeables/{next_id}/resolve",
    }
    for what, url in replays.items():
        replayed = httpx2.post(url, content=body, headers=headers, timeout=60)
        assert replayed.status_code == 409, (what, replayed.text)
        assert replayed.json()["outcome"] == "replayed", (what, replayed.text)
    assert stack.answers() == answers  # no answer forwarded
    assert stack.parked("standard-two") is not None  # the other call still waits

    # What the claim keeps names no call to whoever reaches the ingress (a tool does): the
    # delivery's id is no secret, a call's id is.
    ingress = stack.dev.server.ingress_url
    claim = f"{ingress}/{AGENT}-parked/all/claim/send"
    again = httpx2.post(claim, json={}, headers={"idempotency-key": delivery_key("msg_one")})
    assert again.json()["status"] == "PreviouslyAccepted", again.text
    kept = httpx2.get(f"{ingress}/restate/invocation/{again.json()['invocationId']}/attach")
    assert kept.status_code == 200 and "mac" in kept.json(), kept.text
    assert awakeable_id not in kept.text and next_id not in kept.text

    # A new delivery for the call answered before is refused, and taken all the same: sent to
    # the other call (its signature does not say which call it is for), it is a replay.
    late, late_headers = standard_webhook(key, {"approved": True}, "msg_late")
    refused_late = httpx2.post(one + path, content=late, headers=late_headers, timeout=60)
    assert refused_late.status_code in (404, 409), refused_late.text
    assert refused_late.json()["outcome"] != "replayed", refused_late.text
    elsewhere = f"{other}/v1/awakeables/{next_id}/resolve"
    replayed = httpx2.post(elsewhere, content=late, headers=late_headers, timeout=60)
    assert (replayed.status_code, replayed.json()["outcome"]) == (409, "replayed"), replayed.text
    assert stack.answers() == answers
    assert stack.parked("standard-two") is not None

    # A bad signature, a stale one: 401, nothing forwarded.
    next_path = f"/v1/awakeables/{next_id}/resolve"
    wrong = standard_webhooks_secret(b"not-the-webhook-secret")
    refused = {
        "another key": standard_webhook(wrong, {"approved": True}, "msg_wrong"),
        "six minutes old": standard_webhook(key, {"approved": True}, "msg_old", age=360),
    }
    for what, (refused_body, refused_headers) in refused.items():
        answer = httpx2.post(other + next_path, content=refused_body, headers=refused_headers)
        assert answer.status_code == 401, (what, answer.text)
    assert stack.answers() == answers
    assert stack.parked("standard-two") is not None

    # A delivery whose answer Restate did not take (503) is sent again under its id, as senders
    # retry: to the other replica, for the same call, it acts.
    _, third_id, _ = stack.park("standard-three")
    third = f"/v1/awakeables/{third_id}/resolve"
    body, headers = standard_webhook(key, {"approved": True}, "msg_retried")
    stack.proxy.unavailable["/answer/send"] = 1
    failed = httpx2.post(one + third, content=body, headers=headers, timeout=60)
    assert failed.status_code >= 500 and stack.proxy.completions(third_id) == [], failed.text
    retried = httpx2.post(other + third, content=body, headers=headers, timeout=60)
    assert retried.status_code == 202, retried.text
    assert stack.proxy.completions(third_id) == ["resolve"]

    # A new delivery (a new id) for the other call acts.
    body, headers = standard_webhook(key, {"approved": False}, "msg_two")
    assert httpx2.post(other + next_path, content=body, headers=headers).status_code == 202
    assert stack.proxy.completions(next_id) == ["resolve"]
    assert stack.result(next_invocation)["status"] == "completed"
    [decision] = stack.decisions("standard-two")
    assert decision["approved"] is False
