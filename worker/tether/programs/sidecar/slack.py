"""Clicks on the buttons of a Slack approval message (`approvals.notify.format: slack`):

    POST /v1/slack/interactions     the Slack app's interactivity request URL

Slack sends a form (`application/x-www-form-urlencoded`) with one field, `payload`: the JSON of
a `block_actions` interaction, signed with the app's signing secret
(`tether.programs.slack.signing`, `TETHER_SLACK_SIGNING_SECRET`). Nothing reaches Restate before
every check passed, in this order: the signing secret is set (404), the body is a small form
(415, 413), Slack's signature is valid and its timestamp within 5 minutes (401), the payload is
one click on an Approve or Deny button of ours (400), and the button's token names a call this
agent has parked, was signed for that call's awakeable id and that decision, and has not expired
(403). Then the call is answered as any other (`Sidecar.answer`: once, through every replica),
with `{"approved", "by": "slack", "approver": "@<username> (<user id>)", "decided_at"}`: the
run's decisions name the Slack user.

Slack wants an answer within 3 seconds, and the message updated through the click's
`response_url`: once the HTTP answer is out, the sidecar replaces the message with the same one
whose buttons say who decided (`messages.decided_message`). A click that came too late (the call
was answered, or is no longer waiting) is acknowledged (200) and only its author is told so
(`messages.reply`), Restate asked for nothing; a refused token gets its 403 and a reply too. A
request Slack did not sign gets no reply (its `response_url` could point anywhere), and replies
go only under `TETHER_SLACK_RESPONSE_URL_PREFIX` (Slack's host).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import httpx2
import orjson
from fastapi import APIRouter, Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse

from ...parked import ParkedCall
from ...secret_env import SLACK_SIGNING_SECRET_ENV
from ..slack.messages import DECISION_OF_ACTION, Message, decided_message, reply
from ..slack.signing import (
    ButtonToken,
    read_button_token,
    verify_button_token,
    verify_slack_request,
)
from ..webhooks import LinkAction, SignatureError, valid_recipient, verified_by_any
from .body import read_limited_body
from .context import Sidecar, SidecarDep
from .rejection import Outcome, Rejection, count, refused
from .settings import SidecarSettings

log = logging.getLogger("tether.programs.sidecar")
router = APIRouter()
ROUTE = "/v1/slack/interactions"
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
MAX_NAME_CHARS = 80
"""Slack's longest user name; a longer or odder one is recorded by the user's id alone."""
LATE: frozenset[Outcome] = frozenset({"already_resolved", "unknown_id"})
"""The refusals of a click that came too late: acknowledged, and its author told."""
REPLY_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class Click:
    """One click on a button of ours, as Slack describes it."""

    decision: LinkAction
    """What the button's `action_id` says (the token must say the same)."""
    token: str
    user_id: str
    user_name: str
    response_url: str | None
    blocks: object
    """The message's blocks as the person saw them (the reply keeps them)."""

    @property
    def approver(self) -> str:
        return f"@{self.user_name} ({self.user_id})"


def _bad(message: str) -> Rejection:
    return Rejection(400, "bad_body", message)


def _authenticate(
    signing_secret: bytes, body: bytes, headers: Mapping[str, str]
) -> tuple[str, int]:
    """The request's signature and timestamp, or a 401 `Rejection`."""
    try:
        return verify_slack_request(signing_secret, body, headers)
    except SignatureError as error:
        reason = str(error)
        if "window" in reason:
            raise Rejection(401, "expired", f"expired: {reason}") from None
        raise Rejection(401, "bad_signature", f"not authenticated: {reason}") from None


def _payload(body: bytes) -> dict[str, Any]:
    """The JSON of the form's `payload` field."""
    try:
        fields = parse_qs(body.decode(), strict_parsing=True, max_num_fields=8)
    except ValueError:  # bad UTF-8, a malformed pair, too many fields
        raise _bad("the form is malformed") from None
    values = fields.get("payload", [])
    if len(values) != 1:
        raise _bad("the form has no payload field (or more than one)")
    try:
        payload = orjson.loads(values[0])
    except orjson.JSONDecodeError:
        raise _bad("the payload is not valid JSON") from None
    if not isinstance(payload, dict):
        raise _bad("the payload is not a JSON object")
    return payload


def read_click(body: bytes) -> Click:
    """The click a (verified) interaction describes, or a 400 `Rejection`."""
    payload = _payload(body)
    if payload.get("type") != "block_actions":
        kind = str(payload.get("type"))[:40]
        raise _bad(f"not a button click: an interaction of type {kind!r}")
    actions = payload.get("actions")
    if not isinstance(actions, list) or len(actions) != 1 or not isinstance(actions[0], dict):
        raise _bad("the interaction has no single action")
    action: dict[str, Any] = actions[0]
    decision = DECISION_OF_ACTION.get(str(action.get("action_id")))
    if decision is None:
        raise _bad("not a button of a Tether approval (unknown action_id)")
    user = payload.get("user")
    user_id = user.get("id") if isinstance(user, dict) else None
    if not isinstance(user, dict) or not isinstance(user_id, str):
        raise _bad("the interaction names no Slack user")
    if not (user_id.isascii() and user_id.isalnum() and len(user_id) <= 32):
        raise _bad("the interaction's Slack user id is malformed")
    name = user.get("username") or user.get("name")
    if not isinstance(name, str) or not valid_recipient(name) or len(name) > MAX_NAME_CHARS:
        name = user_id
    response_url = payload.get("response_url")
    message = payload.get("message")
    return Click(
        decision=decision,
        token=str(action.get("value", "")),
        user_id=user_id,
        user_name=name,
        response_url=response_url if isinstance(response_url, str) else None,
        blocks=message.get("blocks") if isinstance(message, dict) else None,
    )


def _verified(secrets: Sequence[bytes], token: ButtonToken, records: list[ParkedCall]) -> str:
    """The awakeable id of the record `token` was signed for, or a 403 `Rejection`."""
    first: SignatureError | None = None
    for record in records:  # one, unless an earlier park of the same call id lingers
        try:
            verified_by_any(secrets, verify_button_token, token, record["awakeable_id"])
        except SignatureError as error:
            first = first or error
            continue
        return record["awakeable_id"]
    raise Rejection(403, "bad_token", f"refused: {first}")


async def _decide(click: Click, sidecar: Sidecar) -> bool:
    """Answer the call the click's token names; whether it was approved."""
    try:
        token = read_button_token(click.token)
    except SignatureError as error:
        raise Rejection(403, "bad_token", f"refused: {error}") from None
    if token.decision != click.decision:
        raise Rejection(403, "bad_token", "refused: the button's token is for the other button")
    # Answered here before: say by whom (the run soon drops the call from the index, and with
    # it the awakeable id a token leads to).
    sidecar.ledger.require_open(token.call)

    def named(record: ParkedCall) -> bool:
        return record["session"] == token.session and record["call_id"] == token.call_id

    records = await sidecar.parked.matching(named)
    if not records:
        raise Rejection(
            404, "unknown_id", "this call is no longer waiting: it was answered, or timed out"
        )
    awakeable_id = _verified(sidecar.settings.secrets, token, records)
    approved = token.decision == "approve"
    how = f"{'approved' if approved else 'denied'} by @{click.user_name} in Slack"
    value = {
        "approved": approved,
        "by": "slack",
        "approver": click.approver,
        "decided_at": int(time.time() * 1000),
    }
    await sidecar.answer(awakeable_id, how, {"value": value}, approver=click.approver)
    sidecar.ledger.done(token.call, how)
    count("approved" if approved else "denied")
    return approved


async def _post_reply(
    settings: SidecarSettings, response_url: str | None, message: Message
) -> None:
    """POST `message` to the click's `response_url`; a failure is logged (the decision stands).
    Only the host is logged: a `response_url` is a credential for a while."""
    if response_url is None:
        return
    prefix = settings.slack_response_url_prefix
    if not (response_url.isprintable() and response_url.startswith(prefix)):
        log.warning("a Slack click's response_url is not under %s: no reply sent", prefix)
        return
    body = orjson.dumps(message)
    try:
        async with httpx2.AsyncClient(timeout=REPLY_TIMEOUT_SECONDS) as client:
            response = await client.post(
                response_url, content=body, headers={"content-type": "application/json"}
            )
    except httpx2.HTTPError as error:
        log.warning("the reply to Slack failed: %s", type(error).__name__)
        return
    if not response.is_success:
        log.warning("the reply to Slack answered HTTP %d", response.status_code)


@router.post(ROUTE)
async def slack_interaction(request: Request, sidecar: SidecarDep) -> JSONResponse:
    """A click on Approve or Deny in a Slack approval message."""
    settings = sidecar.settings
    signing_secret = settings.slack_secret
    if signing_secret is None:
        raise Rejection(
            404,
            "not_configured",
            f"Slack interactions are not set up here: {SLACK_SIGNING_SECRET_ENV} is not set "
            "(spec.approvals.notify.slackSigningSecretRef)",
        )
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != FORM_CONTENT_TYPE:
        raise Rejection(415, "unsupported_media_type", f"the body must be {FORM_CONTENT_TYPE}")
    body = await read_limited_body(request.receive, request.headers, settings.max_body_bytes)
    signature, timestamp = _authenticate(signing_secret, body, request.headers)
    click = read_click(body)

    async def decide() -> bool:
        return await _decide(click, sidecar)

    try:
        approved = await sidecar.once(signature, timestamp, decide)
    except Rejection as error:
        if error.outcome == "replayed":  # this very request again: it had its reply
            raise
        refused(
            error,
            method="POST",
            route=ROUTE,
            logged_id="-",
            client=request.client.host if request.client else None,
        )
        text = f"{error.message[:1].upper()}{error.message[1:]}; your click changed nothing."
        return JSONResponse(
            {"error": error.message, "outcome": error.outcome},
            200 if error.outcome in LATE else error.status,
            background=BackgroundTask(_post_reply, settings, click.response_url, reply(text)),
        )
    message = decided_message(click.blocks, approved=approved, who=click.user_name)
    return JSONResponse(
        {"outcome": "approved" if approved else "denied", "approver": click.approver},
        background=BackgroundTask(_post_reply, settings, click.response_url, message),
    )
