"""Resolutions signed with the Standard Webhooks scheme (https://www.standardwebhooks.com), on the
same routes as Tether's own signature (`signed_posts`: `/v1/awakeables/{id}/resolve` and
`/reject`), so any sender that implements the scheme answers a parked call without a Tether
client:

    webhook-id: <the delivery's id>    webhook-timestamp: <unix seconds>
    webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<raw body>")>

The key is the agent's webhook secret (the previous one too, during a rotation), which a sender
takes as `whsec_<base64 of the secret>` (`tether.programs.webhooks.standard_webhooks_secret`).
A request carries this scheme when it has `webhook-signature` and no `X-Tether-Signature`. The
`standardwebhooks` package verifies it: the timestamp within 5 minutes, the signature (any of
the space-separated `v1,` ones) compared in constant time.

The signature covers neither the path nor the call: what keeps a captured delivery from
answering another call is its `webhook-id`, which acts once, through every replica and restart
(`Sidecar.claim_delivery` claims it in Restate for its call as soon as its signature verifies,
before anything can refuse it: sent again, it goes on for that call only; the replay guard
refuses it first in the process that saw it).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any

from standardwebhooks import Webhook, WebhookVerificationError
from starlette.types import Receive

from ..webhooks import IDEMPOTENCY_KEY, SIGNATURE_HEADER
from .body import parse_json, read_limited_body, require_json_content_type
from .rejection import Rejection

ID_HEADER = "webhook-id"
TIMESTAMP_HEADER = "webhook-timestamp"
SIGNATURE_HEADERS = "webhook-signature"


def signed_with_standard_webhooks(headers: Mapping[str, str]) -> bool:
    return SIGNATURE_HEADERS in headers and SIGNATURE_HEADER not in headers


def _malformed() -> Rejection:
    return Rejection(401, "bad_signature", "not authenticated: malformed webhook-signature")


def _well_formed(signatures: str) -> bool:
    """Whether every space-separated signature is `<version>,<base64>` (checked here: what the
    package raises for a malformed one changed between its releases)."""
    entries = signatures.split()
    for entry in entries:
        version, comma, signature = entry.partition(",")
        if not (version and comma and signature):
            return False
        try:
            base64.b64decode(signature, validate=True)
        except ValueError:  # binascii.Error: not base64
            return False
    return bool(entries)


def _refusal(error: WebhookVerificationError) -> Rejection:
    reason = str(error)
    if "too old" in reason or "too new" in reason:
        return Rejection(
            401, "expired", "expired: the webhook-timestamp is outside the accepted window"
        )
    if "Missing" in reason:
        return Rejection(
            401,
            "bad_signature",
            "not authenticated: webhook-id, webhook-timestamp and webhook-signature are needed",
        )
    return Rejection(401, "bad_signature", "not authenticated: webhook-signature does not match")


def authenticate_standard_webhook(
    secrets: Sequence[bytes], body: bytes, headers: Mapping[str, str]
) -> tuple[str, int]:
    """The request's `webhook-id` and timestamp, or a 401 `Rejection`."""
    delivery = headers.get(ID_HEADER, "")
    if IDEMPOTENCY_KEY.fullmatch(delivery) is None:
        raise Rejection(
            401, "bad_signature", "not authenticated: webhook-id must be 1-256 printable characters"
        )
    signed = {
        name: headers.get(name, "") for name in (ID_HEADER, TIMESTAMP_HEADER, SIGNATURE_HEADERS)
    }
    if signed[SIGNATURE_HEADERS] and not _well_formed(signed[SIGNATURE_HEADERS]):
        raise _malformed()
    first: WebhookVerificationError | None = None
    for secret in secrets:  # the current key, then the previous one during a rotation
        try:
            Webhook(secret).verify(body, signed, json_parse=False)
        except WebhookVerificationError as error:
            first = first or error
            continue
        except ValueError:  # a body that is not UTF-8
            raise _malformed() from None
        return delivery, int(float(signed[TIMESTAMP_HEADER]))
    assert first is not None, "no webhook secret"
    raise _refusal(first)


async def read_standard_webhook(
    receive: Receive, headers: Mapping[str, str], secrets: Sequence[bytes], limit: int
) -> tuple[Any, str, int]:
    """A Standard Webhooks JSON request's value, `webhook-id` and timestamp: content type, size
    limit, signature, then JSON, in that order."""
    require_json_content_type(headers)
    body = await read_limited_body(receive, headers, limit)
    delivery, timestamp = authenticate_standard_webhook(secrets, body, headers)
    return parse_json(body), delivery, timestamp
