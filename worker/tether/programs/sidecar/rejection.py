"""`Rejection`: why the sidecar refused a webhook request, with its HTTP status and the outcome
label it is counted under in `tether_webhook_requests_total`; `refused` logs and counts one."""

from __future__ import annotations

import logging
from typing import Literal

from ...errors import TetherError
from ..metrics import WEBHOOK_REQUESTS

log = logging.getLogger("tether.programs.sidecar")

Outcome = Literal[
    "resolved",
    "rejected",
    "approved",
    "denied",
    "shown",
    "listed",
    "run_started",
    "message_posted",
    "bad_signature",
    "expired",
    "cross_site",
    "bad_token",
    "replayed",
    "too_large",
    "too_many",
    "unsupported_media_type",
    "bad_id",
    "bad_body",
    "unknown_id",
    "already_resolved",
    "restate_unavailable",
    "restate_error",
    "not_configured",
]


class Rejection(TetherError):
    """A refused request. `message` is shown to the caller and logged: it never holds a secret
    or a signature."""

    def __init__(self, status: int, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.outcome = outcome
        self.message = message

    @property
    def headers(self) -> dict[str, str]:
        """A 503 is Restate out of reach for a moment (a partition between leaders, a node
        lost): the same request, newly signed, may be sent again."""
        return {"retry-after": "1"} if self.status == 503 else {}


def count(outcome: Outcome) -> None:
    WEBHOOK_REQUESTS.labels(outcome).inc()


def refused(
    error: Rejection, *, method: str, route: str, logged_id: str, client: str | None
) -> None:
    """Log a refusal (by route template, never the raw path or query) and count its outcome;
    `logged_id` is the awakeable id as `awakeable_id.loggable_id` shows it."""
    log.warning(
        "refused %s %s: %s %s (%s) id=%s client=%s",
        method,
        route,
        error.status,
        error.outcome,
        error.message,
        logged_id,
        client or "-",
    )
    count(error.outcome)
