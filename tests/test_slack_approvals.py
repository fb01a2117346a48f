"""Slack approvals without a server: the Block Kit message and its buttons' tokens, Slack's
request signatures, the reply that replaces the buttons, the spec and the sidecar's settings;
and the key a Standard Webhooks sender uses. The whole path (a real worker posting to a fake
Slack, clicks through two sidecars to a real restate-server) is
`tests/restate/test_slack_approvals.py`."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

import httpx2
import pytest
from standardwebhooks import Webhook

from tether.parked import ParkedCall
from tether.programs.sidecar import (
    SidecarConfigError,
    SidecarSettings,
    create_app,
    settings_from_env,
)
from tether.programs.sidecar.rejection import Rejection
from tether.programs.sidecar.standard_webhooks import authenticate_standard_webhook
from tether.programs.slack.messages import (
    SECTION_TEXT_LIMIT,
    approval_message,
    decided_message,
    reply,
)
from tether.programs.slack.signing import (
    button_token,
    read_button_token,
    sign_slack_request,
    verify_button_token,
    verify_slack_request,
)
from tether.programs.webhooks import SignatureError, standard_webhooks_secret
from tether.spec import SpecError, parse_agent

SECRET = b"the-webhook-secret-of-the-slack-tests"
SIGNING = b"8f742231b10e8888abcd99yyyzzz85a5"  # the shape of a Slack app's signing secret
ID = "sign_1gqTN3y9Wu3RzrA0hk07IPzadRDUONRZgAAAAEQ"
OTHER_ID = "sign_1gqTN3y9Wu3T4gKaIN_iHuhD7oazR7WB-AAAAEQ"
ARGS = {"path": "out.txt", "content": "yes & <no>"}


def record(awakeable_id: str = ID, **extra: Any) -> ParkedCall:
    parked: ParkedCall = {
        "awakeable_id": awakeable_id,
        "kind": "approval",
        "agent": "clerk",
        "session": "s1",
        "tool": "write_file",
        "call_id": "call_0_0",
        "input_summary": json.dumps(ARGS),
        "created_at": time.time() * 1000,
        "expires_at": time.time() * 1000 + 3_600_000,
    }
    parked.update(extra)  # type: ignore[typeddict-item]
    return parked


def blocks_of(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [block for block in message["blocks"] if block["type"] == kind]


def test_the_message_shows_the_call_and_two_buttons_signed_for_it() -> None:
    message = approval_message(record(), ARGS, SECRET)
    assert "write_file" in message["text"] and "session s1" in message["text"]
    [header] = blocks_of(message, "header")
    assert header["text"]["text"] == "Approval needed: write_file"
    fields = [field["text"] for block in message["blocks"] for field in block.get("fields", [])]
    assert fields[:3] == ["*Agent*\nclerk", "*Tool*\n`write_file`", "*Session*\n`s1`"]
    assert fields[3].startswith("*Times out*\n<!date^")
    [_, code] = blocks_of(message, "section")
    assert code["text"]["text"] == (
        '*Input*\n```\n{\n  "path": "out.txt",\n  "content": "yes &amp; &lt;no&gt;"\n}\n```'
    )
    [actions] = blocks_of(message, "actions")
    approve, deny = actions["elements"]
    assert (approve["action_id"], approve["style"], approve["text"]["text"]) == (
        "tether:approve",
        "primary",
        "Approve",
    )
    assert (deny["action_id"], deny["style"], deny["text"]["text"]) == (
        "tether:deny",
        "danger",
        "Deny",
    )
    assert ID not in json.dumps(message)  # an awakeable id answers its call through Restate
    for button, decision in ((approve, "approve"), (deny, "deny")):
        token = read_button_token(button["value"])
        assert (token.session, token.call_id, token.decision) == ("s1", "call_0_0", decision)
        verify_button_token(SECRET, token, ID)
        with pytest.raises(SignatureError, match="not made for this call"):
            verify_button_token(SECRET, token, OTHER_ID)  # the same call id in another park
        with pytest.raises(SignatureError, match="not made for this call"):
            verify_button_token(b"another-secret-0123456789", token, ID)


def test_a_request_for_more_budget_says_so_and_has_the_same_buttons() -> None:
    asked = {"spent": {"cost_usd": 0.2}, "budget": {"cost_usd": 0.25}}
    message = approval_message(record(tool="budget", call_id="budget:2:0"), asked, SECRET)
    [header] = blocks_of(message, "header")
    assert header["text"]["text"] == "Approval needed: more budget"
    assert (
        message["text"] == "clerk ran out of budget and waits for approval to raise it (session s1)"
    )
    [actions] = blocks_of(message, "actions")
    assert [e["action_id"] for e in actions["elements"]] == ["tether:approve", "tether:deny"]
    # A tool of the agent's own named `budget` is announced as a tool call.
    tool = approval_message(record(tool="budget"), ARGS, SECRET)
    assert blocks_of(tool, "header")[0]["text"]["text"] == "Approval needed: budget"


def test_a_token_acts_for_its_decision_and_until_the_deadline_only() -> None:
    expires = int(time.time()) + 60
    value = button_token(SECRET, ID, session="s1", call_id="c", decision="deny", expires=expires)
    as_approve = json.loads(value) | {"decision": "approve"}
    with pytest.raises(SignatureError, match="not made for this call"):
        verify_button_token(SECRET, read_button_token(json.dumps(as_approve)), ID)
    later = json.loads(value) | {"exp": expires + 3600}
    with pytest.raises(SignatureError, match="not made for this call"):
        verify_button_token(SECRET, read_button_token(json.dumps(later)), ID)
    with pytest.raises(SignatureError, match="expired"):
        verify_button_token(SECRET, read_button_token(value), ID, now=expires + 1)
    for malformed in ("", "{", "[]", '{"v": 2}', json.dumps(json.loads(value) | {"exp": "1"})):
        with pytest.raises(SignatureError, match=r"malformed|no token"):
            read_button_token(malformed)


def test_a_long_input_is_cut_to_fit_a_section() -> None:
    big = {"content": ("a&b<c>```" + "é😀" * 50) * 400}
    [_, code] = blocks_of(approval_message(record(), big, SECRET), "section")
    text = code["text"]["text"]
    assert len(text.encode("utf-16-le")) // 2 <= SECTION_TEXT_LIMIT  # as Slack counts
    assert len(text.encode("utf-16-le")) // 2 > SECTION_TEXT_LIMIT - 200  # and not far below
    body, _, note = text.removeprefix("*Input*\n```\n").rpartition("\n```")
    assert body.endswith("…") and "```" not in body  # the code block is closed once, at the end
    assert note.startswith("\n_cut to fit Slack's limit:") and "characters in all_" in note
    assert re.findall(r"&(?!amp;|lt;|gt;)", body) == []  # every `&` starts a whole escape


@pytest.mark.parametrize("shift", range(5))
def test_a_cut_never_splits_an_escape(shift: int) -> None:
    big = {"c": "x" * shift + "&" * 5000}
    [_, code] = blocks_of(approval_message(record(), big, SECRET), "section")
    body = code["text"]["text"].removeprefix("*Input*\n```\n").rpartition("\n```")[0]
    assert body.endswith("&amp;…") and re.findall(r"&(?!amp;)", body) == []


def test_no_buttons_without_the_secret_nor_for_a_question() -> None:
    for message in (
        approval_message(record(), ARGS, None),
        approval_message(record(kind="ask_human"), {"question": "blue?"}, SECRET),
    ):
        assert blocks_of(message, "actions") == []
        assert "tether resolve" in json.dumps(message)


def test_slack_request_signatures() -> None:
    body = b"payload=%7B%7D"
    headers = sign_slack_request(SIGNING, body)
    stamp = headers["x-slack-request-timestamp"]
    expected = hmac.new(SIGNING, f"v0:{stamp}:".encode() + body, hashlib.sha256).hexdigest()
    assert headers["x-slack-signature"] == f"v0={expected}"  # Slack's documented scheme
    assert verify_slack_request(SIGNING, body, headers) == (f"v0={expected}", int(stamp))
    cases = [
        (b"payload=%7B%7E", headers, "does not match"),
        (body, {**headers, "x-slack-signature": "v1=" + expected}, "version"),
        (body, sign_slack_request(SIGNING, body, timestamp=int(time.time()) - 360), "window"),
        (body, {"x-slack-signature": headers["x-slack-signature"]}, "missing"),
        (body, sign_slack_request(b"another-signing-secret", body), "does not match"),
    ]
    for sent, signed, problem in cases:
        with pytest.raises(SignatureError, match=problem):
            verify_slack_request(SIGNING, sent, signed)


def test_the_decision_replaces_the_buttons_and_keeps_the_rest() -> None:
    original = approval_message(record(), ARGS, SECRET)["blocks"]
    decided = decided_message(original, approved=True, who="alice")
    assert decided["replace_original"] is True and decided["text"] == "Approved by @alice"
    assert [b["type"] for b in decided["blocks"]] == [
        "header" if b["type"] == "header" else "section" if b["type"] != "context" else "context"
        for b in original
    ]
    assert "*Approved by @alice*" in json.dumps(decided["blocks"])
    denied = decided_message(None, approved=False, who="b<o>b")
    assert denied["text"] == "Denied by @b&lt;o&gt;b" and len(denied["blocks"]) == 1
    assert reply("it was <done>") == {
        "response_type": "ephemeral",
        "replace_original": False,
        "text": "it was &lt;done&gt;",
    }


def manifest(**notify: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "clerk"},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": [{"text": "hi"}]},
            "approvals": {"notify": {"urlSecretRef": {"name": "slack", "key": "url"}, **notify}},
        },
    }


def test_the_spec_takes_the_slack_format_and_its_signing_secret() -> None:
    ref = {"name": "slack", "key": "signing-secret"}
    notify = parse_agent(manifest(format="slack", slackSigningSecretRef=ref)).spec.approvals.notify
    assert notify is not None and notify.format == "slack"
    assert notify.slack_signing_secret_ref is not None
    default = parse_agent(manifest()).spec  # json; left out of the rendered spec (its hash)
    assert default.approvals.notify is not None and default.approvals.notify.format is None
    rendered = default.model_dump(by_alias=True, exclude_none=True)["approvals"]["notify"]
    assert rendered == {"urlSecretRef": {"name": "slack", "key": "url"}}
    with pytest.raises(SpecError, match="slackSigningSecretRef` is for `format: slack"):
        parse_agent(manifest(slackSigningSecretRef=ref))
    with pytest.raises(SpecError, match="recipients` is for `format: json"):
        parse_agent(manifest(format="slack", recipients=["@alice"]))
    with pytest.raises(SpecError, match="format"):
        parse_agent(manifest(format="teams"))


def test_the_sidecar_reads_the_signing_secret_from_its_environment() -> None:
    env = {
        "RESTATE_INGRESS_URL": "http://restate:8080",
        "TETHER_AGENT": "clerk",
        "TETHER_WEBHOOK_SECRET": SECRET.decode(),
    }
    assert settings_from_env(env).slack_secret is None
    with_slack = settings_from_env({**env, "TETHER_SLACK_SIGNING_SECRET": SIGNING.decode()})
    assert with_slack.slack_secret == SIGNING
    assert SIGNING.decode() not in repr(with_slack)
    assert with_slack.slack_response_url_prefix == "https://hooks.slack.com/"
    with pytest.raises(SidecarConfigError, match="TETHER_SLACK_SIGNING_SECRET must be at least"):
        settings_from_env({**env, "TETHER_SLACK_SIGNING_SECRET": "short"})
    with pytest.raises(SidecarConfigError, match="TETHER_SLACK_RESPONSE_URL_PREFIX"):
        settings_from_env({**env, "TETHER_SLACK_RESPONSE_URL_PREFIX": "hooks.slack.com"})


def standard_headers(
    key: str, body: bytes, msg_id: str = "msg_1", age: float = 0
) -> dict[str, str]:
    stamp = datetime.fromtimestamp(time.time() - age, UTC)
    signature = Webhook(key).sign(msg_id, stamp, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(stamp.timestamp())),
        "webhook-signature": signature,
    }


def test_a_standard_webhooks_sender_signs_with_the_webhook_secret_as_whsec() -> None:
    key = standard_webhooks_secret(SECRET)
    assert key == "whsec_" + base64.b64encode(SECRET).decode()
    body = b'{"approved": true}'
    headers = standard_headers(key, body)
    delivery, stamp = authenticate_standard_webhook([SECRET], body, headers)
    assert delivery == "msg_1" and abs(stamp - time.time()) < 5
    previous = b"the-previous-webhook-secret"  # during a rotation, either key
    assert authenticate_standard_webhook([previous, SECRET], body, headers)[0] == "msg_1"
    cases = [
        (body, standard_headers(standard_webhooks_secret(previous), body), "does not match"),
        (b'{"approved": false}', headers, "does not match"),
        (body, standard_headers(key, body, age=360), "expired"),
        (body, {**headers, "webhook-signature": "v1"}, "malformed"),
        (body, {**headers, "webhook-signature": "v1,not-base64!"}, "malformed"),
        (body, {**headers, "webhook-id": ""}, "webhook-id"),
        (body, {k: v for k, v in headers.items() if k != "webhook-timestamp"}, "are needed"),
    ]
    for sent, signed, problem in cases:
        with pytest.raises(Rejection, match=problem) as refused:
            authenticate_standard_webhook([SECRET], sent, signed)
        assert refused.value.status == 401


# -- the sidecar's route, up to where it would ask Restate ------------------------------------


def click_form(payload: Any, signing_secret: bytes = SIGNING) -> tuple[bytes, dict[str, str]]:
    body = urlencode({"payload": json.dumps(payload)}).encode()
    headers = {
        **sign_slack_request(signing_secret, body),
        "content-type": "application/x-www-form-urlencoded",
    }
    return body, headers


def a_click(**changes: Any) -> dict[str, Any]:
    click = {
        "type": "block_actions",
        "user": {"id": "U0ALICE", "username": "alice"},
        "response_url": "https://hooks.slack.com/actions/T0/1/r3sp0nse",
        "actions": [{"action_id": "tether:approve", "value": "not a token"}],
    }
    return click | changes


async def test_the_route_refuses_what_it_cannot_take(caplog: pytest.LogCaptureFixture) -> None:
    """Every refusal here comes before Restate is asked: the sidecar's Restate is a closed
    port, so one that asked would answer 503."""
    values = {
        "restate_ingress_url": "http://127.0.0.1:9/ingress",
        "agent": "clerk",
        "webhook_secret": SECRET.decode(),
    }
    route = "/v1/slack/interactions"

    async def send(app_settings: SidecarSettings, body: bytes, headers: dict[str, str]) -> Any:
        app = create_app(app_settings)
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://sidecar") as client:
            return await client.post(route, content=body, headers=headers)

    without = SidecarSettings(**values)
    answer = await send(without, *click_form(a_click()))
    assert answer.status_code == 404 and answer.json()["outcome"] == "not_configured"
    assert "TETHER_SLACK_SIGNING_SECRET is not set" in answer.json()["error"]

    settings = SidecarSettings(**values, slack_signing_secret=SIGNING.decode())
    body, headers = click_form(a_click())
    form = headers["content-type"]
    no_field = {**sign_slack_request(SIGNING, b"other=1"), "content-type": form}
    cases = {
        "json": (body, {**headers, "content-type": "application/json"}, 415),
        "unsigned": (body, {"content-type": form}, 401),
        "no payload field": (b"other=1", no_field, 400),
        "a payload that is no object": (*click_form(None), 400),
        "not a click": (*click_form(a_click(type="view_submission")), 400),
        "not our button": (
            *click_form(a_click(actions=[{"action_id": "other", "value": "x"}])),
            400,
        ),
        "no user": (*click_form(a_click(user={})), 400),
        # int() of 4,301 digits raises: refused as any malformed stamp, not a 500
        "a stamp of 5,000 digits": (
            body,
            {**headers, "x-slack-request-timestamp": "9" * 5000},
            401,
        ),
        "a stamp in other digits": (
            body,
            {**headers, "x-slack-request-timestamp": ("²" * 10).encode("latin-1")},
            401,
        ),
    }
    for what, (sent, sent_headers, status) in cases.items():
        answer = await send(settings, sent, sent_headers)
        assert answer.status_code == status, (what, answer.text)

    # A signed click whose token is no token: 403, and its reply goes only to Slack's host.
    elsewhere = a_click(response_url="http://127.0.0.1:9/ingress/clerk/s1/run/send")
    with caplog.at_level(logging.WARNING, logger="tether.programs.sidecar"):
        answer = await send(settings, *click_form(elsewhere))
    assert answer.status_code == 403 and answer.json()["outcome"] == "bad_token"
    assert "response_url is not under https://hooks.slack.com/: no reply sent" in caplog.text
