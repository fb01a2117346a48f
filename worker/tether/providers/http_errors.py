"""What the SDK-backed providers share about HTTP errors: which statuses to retry, how long the
server asked to wait, and keeping the API key out of error messages."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

from .base import ProviderError

RETRYABLE_STATUSES = frozenset({408, 409, 429})
"""Plus every 5xx."""
MIN_SECRET_LENGTH = 8
"""Shorter "keys" (placeholders, tests) are not searched for in errors."""


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES or status >= 500


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The server's requested wait: `retry-after-ms`, or `retry-after` in seconds or as a date."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(float(millis) / 1000, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def without_key(
    api_key: str, error: ProviderError, cause: Exception
) -> tuple[ProviderError, Exception | None]:
    """A server may echo the credential in an error body: it must reach neither the message
    nor, through the SDK exception chained as the cause, a logged traceback."""
    if len(api_key) < MIN_SECRET_LENGTH or api_key not in f"{error} {cause}":
        return error, cause
    error.args = (str(error).replace(api_key, "[redacted]"),)
    return error, None
