"""Slack's request signatures, and the tokens of the approval message's buttons.

Requests: Slack signs what it sends an app with the app's signing secret
(https://api.slack.com/authentication/verifying-requests-from-slack):
`X-Slack-Request-Timestamp: <unix seconds>` and
`X-Slack-Signature: v0=<hex HMAC-SHA256(signing secret, "v0:<timestamp>:<raw body>")>`. The
sidecar accepts one within `TOLERANCE_SECONDS` of its own clock, compared in constant time.

Buttons: Approve and Deny each carry a token in their `value`, signed with the agent's webhook
secret (the signing secret is Slack's, and only the sidecar holds it), as compact JSON:

    {"v": 1, "session": "<session>", "call": "<call id>", "decision": "approve" | "deny",
     "exp": <unix seconds>, "sig": "<hex HMAC-SHA256(webhook secret, the fields and the
     call's awakeable id)>"}

It names the call and holds no awakeable id: everyone in the channel reads the message, and an
awakeable id answers its call through Restate's own API. The sidecar finds the call by its name
among the agent's parked calls and checks `sig` against that call's awakeable id, so a token
acts on the one park it was made for (a call id repeats across sessions and runs), with its own
decision, until `exp` (the park's deadline).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..webhooks import (
    TOLERANCE_SECONDS,
    LinkAction,
    SignatureError,
    hmac_hex,
    signatures_equal,
    unix_seconds,
)

SIGNATURE_HEADER = "x-slack-signature"
TIMESTAMP_HEADER = "x-slack-request-timestamp"
TOKEN_VERSION = 1
MAX_TOKEN_CHARS = 2000
"""Slack's limit on a button's `value`."""
DECISIONS: tuple[LinkAction, ...] = ("approve", "deny")


def sign_slack_request(
    signing_secret: bytes, body: bytes, *, timestamp: int | None = None
) -> dict[str, str]:
    """The headers Slack puts on a request with `body` (for tests and other senders)."""
    stamp = int(time.time()) if timestamp is None else timestamp
    signature = hmac_hex(signing_secret, f"v0:{stamp}:".encode() + body)
    return {TIMESTAMP_HEADER: str(stamp), SIGNATURE_HEADER: f"v0={signature}"}


def verify_slack_request(
    signing_secret: bytes, body: bytes, headers: Mapping[str, str], *, now: float | None = None
) -> tuple[str, int]:
    """Check a request signed by Slack; its signature and timestamp, or `SignatureError`."""
    stamp, signature = headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER)
    if not stamp or not signature:
        raise SignatureError("missing X-Slack-Signature or X-Slack-Request-Timestamp")
    stamped = unix_seconds(stamp)
    if stamped is None:
        raise SignatureError("malformed X-Slack-Request-Timestamp")
    current = time.time() if now is None else now
    if abs(current - stamped) > TOLERANCE_SECONDS:
        raise SignatureError("X-Slack-Request-Timestamp is outside the accepted window")
    if not signature.startswith("v0="):
        raise SignatureError("unknown X-Slack-Signature version")
    expected = hmac_hex(signing_secret, f"v0:{stamp}:".encode() + body)
    if not signatures_equal(expected, signature.removeprefix("v0=")):
        raise SignatureError("X-Slack-Signature does not match")
    return signature, stamped


@dataclass(frozen=True)
class ButtonToken:
    """A button's token, as read (not yet verified)."""

    session: str
    call_id: str
    decision: LinkAction
    expires: int
    signature: str

    @property
    def call(self) -> str:
        """The park the token names, as one string (a ledger key; never an awakeable id)."""
        return json.dumps(["slack-call", self.session, self.call_id, self.expires])


def _token_mac(
    secret: bytes,
    awakeable_id: str,
    session: str,
    call_id: str,
    decision: LinkAction,
    expires: int,
) -> str:
    fields = ["tether-slack-button:v1", awakeable_id, session, call_id, decision, expires]
    return hmac_hex(secret, json.dumps(fields, separators=(",", ":")).encode())


def button_token(
    secret: bytes,
    awakeable_id: str,
    *,
    session: str,
    call_id: str,
    decision: LinkAction,
    expires: int,
) -> str:
    """The `value` of the button that takes `decision` on the call parked on `awakeable_id`."""
    token = {
        "v": TOKEN_VERSION,
        "session": session,
        "call": call_id,
        "decision": decision,
        "exp": expires,
        "sig": _token_mac(secret, awakeable_id, session, call_id, decision, expires),
    }
    return json.dumps(token, separators=(",", ":"), ensure_ascii=False)


def read_button_token(value: object) -> ButtonToken:
    """The fields of a button's `value`, or `SignatureError` if it is not a token of ours."""
    if not isinstance(value, str) or len(value) > MAX_TOKEN_CHARS:
        raise SignatureError("the button carries no token")
    try:
        token: Any = json.loads(value)
    except ValueError:
        raise SignatureError("the button's token is malformed") from None
    if not isinstance(token, dict) or token.get("v") != TOKEN_VERSION:
        raise SignatureError("the button's token is malformed")
    session, call_id, decision = token.get("session"), token.get("call"), token.get("decision")
    expires, signature = token.get("exp"), token.get("sig")
    if not (
        isinstance(session, str)
        and isinstance(call_id, str)
        and decision in DECISIONS
        and isinstance(expires, int)
        and not isinstance(expires, bool)
        and isinstance(signature, str)
    ):
        raise SignatureError("the button's token is malformed")
    return ButtonToken(session, call_id, decision, expires, signature)


def verify_button_token(
    secret: bytes, token: ButtonToken, awakeable_id: str, *, now: float | None = None
) -> None:
    """`SignatureError` unless `token` was made with `secret` for the call parked on
    `awakeable_id`, and has not expired."""
    expected = _token_mac(
        secret, awakeable_id, token.session, token.call_id, token.decision, token.expires
    )
    if not signatures_equal(expected, token.signature):
        raise SignatureError("the button's token was not made for this call")
    if (time.time() if now is None else now) > token.expires:
        raise SignatureError("the button expired with the call's deadline")
