"""`Rejection`: why the sidecar refused a webhook request, with its HTTP status and the outcome
label it is counted under in `tether_webhook_requests_total`."""

from __future__ import annotations

from typing import Literal

Outcome = Literal[
    "resolved",
    "rejected",
    "approved",
    "denied",
    "listed",
    "bad_signature",
    "expired",
    "replayed",
    "too_large",
    "unsupported_media_type",
    "bad_id",
    "bad_body",
    "unknown_id",
    "already_resolved",
    "restate_unavailable",
    "restate_error",
]


class Rejection(Exception):
    """A refused request. `message` is shown to the caller and logged: it never holds a secret
    or a signature."""

    def __init__(self, status: int, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.outcome = outcome
        self.message = message
