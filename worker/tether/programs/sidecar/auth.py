"""Authentication of webhook requests and approval links with `tether.programs.webhooks`, the
Restate idempotency key a signed request acts under (`signature_key`), and the replay guard: a
cheap, per-process first line that refuses a signature this process saw while its timestamp is
inside the window. (The form of a link's page has its own checks: `link_form`.)

That a signed request acts at most once does not depend on the guard (each replica and each
restart has its own): the sidecar sends it to Restate under an idempotency key derived from its
signature (or its signed `Idempotency-Key`), and Restate, where the state lives, deduplicates.
"""

from __future__ import annotations

import hashlib
import heapq
import time
from collections.abc import Mapping, Sequence

from ..webhooks import (
    TIMESTAMP_HEADER,
    TOLERANCE_SECONDS,
    LinkAction,
    SignatureError,
    verified_by_any,
    verify_link,
    verify_request,
)
from .rejection import Rejection


def _malformed() -> Rejection:
    return Rejection(401, "bad_signature", "not authenticated: malformed signature")


def _refusal(error: SignatureError) -> Rejection:
    reason = str(error)
    if "expired" in reason or "window" in reason:
        return Rejection(401, "expired", f"expired: {reason}")
    return Rejection(401, "bad_signature", f"not authenticated: {reason}")


SIGNATURE_KEY_PREFIX = "tether-sig-"


def signature_key(signature: str) -> str:
    """The Restate idempotency key of a signed request: every signed request is unique by its
    signature (an HMAC over its timestamp, path, key and body), so a replay of it, through any
    replica, maps to the same Restate invocation. A hash, so no signature reaches Restate."""
    return SIGNATURE_KEY_PREFIX + hashlib.sha256(signature.encode()).hexdigest()[:32]


class ReplayGuard:
    """Remembers the signatures of accepted requests until their timestamp leaves the window
    (in this process only: a first line, not what makes a request act once)."""

    def __init__(self, tolerance_seconds: float = TOLERANCE_SECONDS) -> None:
        self._tolerance = tolerance_seconds
        self._seen: dict[str, float] = {}
        self._expiry: list[tuple[float, str]] = []  # a heap, so pruning costs O(log n)

    def claim(self, signature: str, timestamp: int) -> None:
        """Accept `signature` once; a second claim inside the window is a replay (409)."""
        now = time.time()
        while self._expiry and self._expiry[0][0] < now:
            until, old = heapq.heappop(self._expiry)
            if self._seen.get(old) == until:
                del self._seen[old]
        if signature in self._seen:
            raise Rejection(409, "replayed", "this signed request was already received")
        until = timestamp + self._tolerance
        self._seen[signature] = until
        heapq.heappush(self._expiry, (until, signature))

    def release(self, signature: str) -> None:
        """Forget a signature whose request had no effect, so that the sender may retry it."""
        self._seen.pop(signature, None)

    def __len__(self) -> int:
        return len(self._seen)


def authenticate_request(
    secrets: Sequence[bytes],
    body: bytes,
    headers: Mapping[str, str],
    path: str,
    idempotency_key: str | None = None,
) -> tuple[str, int]:
    """The request's signature and timestamp, or a 401 `Rejection`. With `idempotency_key`,
    the signature must cover it (`tether.programs.webhooks`); a sender that signed the request
    without its key is told so."""
    try:
        signature = verified_by_any(
            secrets, verify_request, body, headers, path=path, idempotency_key=idempotency_key
        )
    except SignatureError as error:
        if idempotency_key is not None and _signed_without_key(secrets, body, headers, path):
            raise Rejection(
                401,
                "bad_signature",
                "not authenticated: the signature does not cover the Idempotency-Key header; "
                'sign "<timestamp>.<path>\\n<idempotency key>\\n<body>" '
                "(see tether.programs.webhooks)",
            ) from None
        raise _refusal(error) from None
    except (ValueError, TypeError):  # non-ASCII digits or signature characters
        raise _malformed() from None
    return signature, int(headers[TIMESTAMP_HEADER])


def _signed_without_key(
    secrets: Sequence[bytes], body: bytes, headers: Mapping[str, str], path: str
) -> bool:
    """Whether the request is signed the way a request without a key is (an old sender)."""
    try:
        verified_by_any(secrets, verify_request, body, headers, path=path)
    except (SignatureError, ValueError, TypeError):
        return False
    return True


def authenticate_link(
    secrets: Sequence[bytes],
    action: LinkAction,
    awakeable_id: str,
    expires: str | None,
    signature: str | None,
    recipient: str | None = None,
) -> None:
    """Check a link's `exp`, `sig` and (if it has one) `to`, or raise a 401 `Rejection`."""
    if not expires or not signature:
        raise Rejection(401, "bad_signature", "not authenticated: the link has no exp or sig")
    try:
        verified_by_any(
            secrets, verify_link, action, awakeable_id, expires, signature, recipient=recipient
        )
    except SignatureError as error:
        raise _refusal(error) from None
    except (ValueError, TypeError):  # non-ASCII digits or signature characters
        raise _malformed() from None
