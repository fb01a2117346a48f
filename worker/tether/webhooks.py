"""Signing and verifying webhook requests and one-click approval links.

Requests: the sender puts `X-Tether-Timestamp: <unix seconds>` and
`X-Tether-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<path>.<raw body>")>` on the
request, where `<path>` is the request's path without the query (so a signature made for one
awakeable cannot resolve another); the receiver accepts it within `TOLERANCE_SECONDS` of its own
clock, once.

Links: `GET /v1/awakeables/<id>/approve?exp=<unix seconds>&sig=<hex>` (or `/deny`), where
`sig = HMAC-SHA256(secret, "<action>:<id>:<exp>")`, valid until `exp`.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Literal
from urllib.parse import urlencode

TIMESTAMP_HEADER = "x-tether-timestamp"
SIGNATURE_HEADER = "x-tether-signature"
TOLERANCE_SECONDS = 300
LinkAction = Literal["approve", "deny"]


class SignatureError(ValueError):
    """Why a request or link was refused (never includes the secret)."""


def _equal(expected: str, given: str) -> bool:
    """Constant-time comparison that refuses (instead of raising on) non-ASCII input."""
    return given.isascii() and hmac.compare_digest(expected, given)


def _digest(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _request_message(stamp: str | int, path: str, body: bytes) -> bytes:
    return f"{stamp}.{path}.".encode() + body


def sign_request(
    secret: bytes, body: bytes, *, path: str, timestamp: int | None = None
) -> dict[str, str]:
    """The headers that authenticate `body` sent to `path`."""
    stamp = int(time.time()) if timestamp is None else timestamp
    signature = _digest(secret, _request_message(stamp, path, body))
    return {TIMESTAMP_HEADER: str(stamp), SIGNATURE_HEADER: f"v1={signature}"}


def verify_request(
    secret: bytes,
    body: bytes,
    headers: Mapping[str, str],
    *,
    path: str,
    now: float | None = None,
) -> str:
    """Check a signed request to `path`; returns its signature (to refuse a replay of it)."""
    stamp, signature = headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER)
    if not stamp or not signature:
        raise SignatureError("missing signature headers")
    if not (stamp.isascii() and stamp.isdigit()):
        raise SignatureError("malformed timestamp")
    current = time.time() if now is None else now
    if abs(current - int(stamp)) > TOLERANCE_SECONDS:
        raise SignatureError("timestamp outside the accepted window")
    if not signature.startswith("v1="):
        raise SignatureError("unknown signature version")
    expected = _digest(secret, _request_message(stamp, path, body))
    if not _equal(expected, signature.removeprefix("v1=")):
        raise SignatureError("signature does not match")
    return signature


def link_signature(secret: bytes, action: LinkAction, awakeable_id: str, expires: int) -> str:
    return _digest(secret, f"{action}:{awakeable_id}:{expires}".encode())


def signed_link(
    base_url: str, secret: bytes, action: LinkAction, awakeable_id: str, expires: int
) -> str:
    """A one-click link that approves or denies the parked call until `expires`."""
    query = urlencode(
        {"exp": expires, "sig": link_signature(secret, action, awakeable_id, expires)}
    )
    return f"{base_url.rstrip('/')}/v1/awakeables/{awakeable_id}/{action}?{query}"


def verify_link(
    secret: bytes,
    action: LinkAction,
    awakeable_id: str,
    expires: str,
    signature: str,
    now: float | None = None,
) -> None:
    if not (expires.isascii() and expires.isdigit()):
        raise SignatureError("malformed expiry")
    if (time.time() if now is None else now) > int(expires):
        raise SignatureError("link expired")
    expected = link_signature(secret, action, awakeable_id, int(expires))
    if not _equal(expected, signature):
        raise SignatureError("signature does not match")
