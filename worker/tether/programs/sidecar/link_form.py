"""What makes a POST of an approval page's form acceptable, besides the link's own signature
(checked again on the POST, `auth.authenticate_link`):

- it comes from the page itself: `Sec-Fetch-Site`, when the browser sends it, says
  `same-origin`, and `Origin`, when it is sent and not `null`, is this host (the page's
  `Referrer-Policy: no-referrer` makes browsers send `Origin: null` on its own form POST);
- it carries the token of a rendering of the page: `<issued>.<nonce>.<HMAC(secret, the link's
  signature, issued, nonce)>`, valid for `FORM_TOKEN_SECONDS`. A link scanner that only fetches
  (GET, HEAD) acts on nothing, and a bare POST of the link's parameters without having rendered
  the page is refused.

The form is small and `application/x-www-form-urlencoded`: `exp`, `sig`, `to` (a link minted
for a recipient), `token` and `decision` (`approve` or `deny`), each once.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from starlette.types import Receive

from ..webhooks import LinkAction, unix_seconds
from .body import read_limited_body
from .rejection import Rejection

FORM_TOKEN_SECONDS = 3600
"""How long the buttons of a rendered page work (the link's own expiry applies too)."""
FORM_MAX_BYTES = 4096
FORM_FIELDS = frozenset({"exp", "sig", "to", "token", "decision"})
CLOCK_SKEW_SECONDS = 60
FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"


def _mac(
    secret: bytes, action: LinkAction, awakeable_id: str, signature: str, issued: int, nonce: str
) -> str:
    message = f"tether-link-form:v1:{action}:{awakeable_id}:{signature}:{issued}:{nonce}"
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def form_token(
    secret: bytes,
    action: LinkAction,
    awakeable_id: str,
    signature: str,
    *,
    now: float | None = None,
) -> str:
    """A fresh token for one rendering of the page of a (verified) link."""
    issued = int(time.time() if now is None else now)
    nonce = secrets.token_hex(8)
    return f"{issued}.{nonce}.{_mac(secret, action, awakeable_id, signature, issued, nonce)}"


def check_form_token(
    secrets: Sequence[bytes],
    action: LinkAction,
    awakeable_id: str,
    signature: str,
    token: str | None,
    *,
    now: float | None = None,
) -> None:
    """Raise a 403 `Rejection` unless `token` was made for this link's page, recently."""
    if not token:
        raise Rejection(403, "bad_token", "refused: open the link and use the page's buttons")
    issued_text, _, rest = token.partition(".")
    nonce, _, mac = rest.partition(".")
    issued = unix_seconds(issued_text)
    if issued is None or not nonce or not mac.isascii():
        raise Rejection(403, "bad_token", "refused: the page's token is malformed")
    current = time.time() if now is None else now
    made = (_mac(secret, action, awakeable_id, signature, issued, nonce) for secret in secrets)
    if not any(hmac.compare_digest(expected, mac) for expected in made):
        raise Rejection(403, "bad_token", "refused: the page's token does not match the link")
    if issued > current + CLOCK_SKEW_SECONDS or current - issued > FORM_TOKEN_SECONDS:
        raise Rejection(
            403, "bad_token", "refused: the page is too old; open the link again to decide"
        )


def _host_port(netloc: str, scheme: str) -> str:
    """`host[:port]`, lower case, without the scheme's default port."""
    host = netloc.lower()
    default = {"http": ":80", "https": ":443"}.get(scheme)
    return host.removesuffix(default) if default else host


def require_same_origin(headers: Mapping[str, str], scheme: str) -> None:
    """Raise a 403 `Rejection` if the browser says the POST comes from another site."""
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        raise Rejection(403, "cross_site", "refused: the form was not posted from its own page")
    origin = headers.get("origin")
    if origin is None or origin == "null":
        return
    parts = urlsplit(origin)
    host = headers.get("host", "")
    # Behind a proxy that ends TLS the sidecar sees http while the page was https: compare the
    # host (and a non-default port) only.
    if not parts.netloc or _host_port(parts.netloc, parts.scheme) not in (
        _host_port(host, parts.scheme),
        _host_port(host, scheme),
    ):
        raise Rejection(403, "cross_site", "refused: the form was posted from another origin")


@dataclass(frozen=True)
class LinkForm:
    exp: str | None
    sig: str | None
    to: str | None
    token: str | None
    decision: str | None


async def read_link_form(receive: Receive, headers: Mapping[str, str]) -> LinkForm:
    """The posted form's fields (415, 413 or 400 `Rejection` if it is not a small, well-formed
    form of the page's fields)."""
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != FORM_CONTENT_TYPE:
        raise Rejection(415, "unsupported_media_type", f"the body must be {FORM_CONTENT_TYPE}")
    body = await read_limited_body(receive, headers, FORM_MAX_BYTES)
    try:
        fields = parse_qs(
            body.decode(),
            keep_blank_values=True,
            strict_parsing=bool(body),
            max_num_fields=len(FORM_FIELDS),
        )
    except ValueError:  # bad UTF-8, a malformed pair, too many fields
        raise Rejection(400, "bad_body", "the form is malformed") from None
    if not set(fields) <= FORM_FIELDS or any(len(values) != 1 for values in fields.values()):
        raise Rejection(400, "bad_body", "the form has unknown or repeated fields")
    one = {name: values[0] for name, values in fields.items()}
    return LinkForm(
        exp=one.get("exp"),
        sig=one.get("sig"),
        to=one.get("to"),
        token=one.get("token"),
        decision=one.get("decision"),
    )
