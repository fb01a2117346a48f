"""Authentication of webhook requests and approval links with `tether.webhooks`, and the
replay guard: a signature is accepted once while its timestamp is inside the window. (The form
of a link's page has its own checks: `link_form`.)"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping

from ..webhooks import (
    TIMESTAMP_HEADER,
    TOLERANCE_SECONDS,
    LinkAction,
    SignatureError,
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


class ReplayGuard:
    """Remembers the signatures of accepted requests until their timestamp leaves the window."""

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
    secret: bytes, body: bytes, headers: Mapping[str, str], path: str
) -> tuple[str, int]:
    """The request's signature and timestamp, or a 401 `Rejection`."""
    try:
        signature = verify_request(secret, body, headers, path=path)
    except SignatureError as error:
        raise _refusal(error) from None
    except (ValueError, TypeError):  # non-ASCII digits or signature characters
        raise _malformed() from None
    return signature, int(headers[TIMESTAMP_HEADER])


def authenticate_link(
    secret: bytes,
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
        verify_link(secret, action, awakeable_id, expires, signature, recipient=recipient)
    except SignatureError as error:
        raise _refusal(error) from None
    except (ValueError, TypeError):  # non-ASCII digits or signature characters
        raise _malformed() from None
