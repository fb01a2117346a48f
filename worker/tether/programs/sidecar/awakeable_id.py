"""Which awakeable ids the sidecar accepts: Restate's look like `sign_1<base64url>`; anything
outside `[A-Za-z0-9_-]{1,256}` (a slash, dots, a percent-encoded traversal) is refused before it
can reach a URL."""

from __future__ import annotations

import re

from .rejection import Rejection

AWAKEABLE_ID = re.compile(r"[A-Za-z0-9_-]{1,256}")


def checked_awakeable_id(raw: str) -> str:
    if AWAKEABLE_ID.fullmatch(raw) is None:
        raise Rejection(
            400, "bad_id", "malformed awakeable id: expected 1-256 characters of A-Z a-z 0-9 _ -"
        )
    return raw


def loggable_id(raw: str) -> str:
    """The id as it may appear in a log line (cut, non-printable characters escaped)."""
    return raw[:80] if AWAKEABLE_ID.fullmatch(raw) else repr(raw[:80])
