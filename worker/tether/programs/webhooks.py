"""Signing and verifying webhook requests and approval links.

Requests: the sender puts `X-Tether-Timestamp: <unix seconds>` and
`X-Tether-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>.<path>.<raw body>")>` on the
request, where `<path>` is the request's path without the query (so a signature made for one
awakeable cannot resolve another); the receiver accepts it within `TOLERANCE_SECONDS` of its own
clock, and it acts once (the sidecar makes it idempotent in Restate, keyed by the signature).
A request that carries an `Idempotency-Key` (a run started by webhook) signs the key too:
`HMAC-SHA256(secret, "<timestamp>.<path>\\n<key>\\n<raw body>")`, `\\n` being a newline. A
key is 1-256 printable ASCII characters without spaces, and a path the sidecar accepts has no
newline, so this message can never equal one without a key (nor one with another key):
dropping or changing the header makes the signature fail.

The sidecar also takes a resolution signed with the Standard Webhooks scheme
(https://www.standardwebhooks.com; `webhook-id`, `webhook-timestamp` and `webhook-signature:
v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`), for senders that implement it: the key
is the same webhook secret, given to them as `standard_webhooks_secret(secret)`
(`whsec_<base64 of the secret>`), and each `webhook-id` acts once
(`tether.programs.sidecar.standard_webhooks`).

Links: `/v1/awakeables/<id>/approve?exp=<unix seconds>&sig=<hex>` (or `/deny`), where
`sig = HMAC-SHA256(secret, "<action>:<id>:<exp>")`, valid until `exp`. A link minted for one
person also carries `to=<recipient>`, and then `sig` covers it too:
`HMAC-SHA256(secret, "<action>:<id>:<exp>:<recipient>")`. Opening a link (GET) only shows the
call; the sidecar acts on the POST of that page's form (`tether.programs.sidecar.approvals`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import urlencode

from ..errors import TetherError

TIMESTAMP_HEADER = "x-tether-timestamp"
SIGNATURE_HEADER = "x-tether-signature"
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,256}")
"""What an `Idempotency-Key` may be: 1-256 printable ASCII characters, no space."""
TOLERANCE_SECONDS = 300
LinkAction = Literal["approve", "deny"]
MAX_RECIPIENT_CHARS = 256


T = TypeVar("T")


class SignatureError(TetherError, ValueError):
    """Why a request or link was refused (never includes the secret)."""


def signatures_equal(expected: str, given: str) -> bool:
    """Constant-time comparison that refuses (instead of raising on) non-ASCII input."""
    return given.isascii() and hmac.compare_digest(expected, given)


def unix_seconds(text: str) -> int | None:
    """`text` as a stamp's or an expiry's whole seconds: ASCII digits, at most 16 of them (a
    link's expiry with any `approvals.timeout` a year holds fits; `int` raises past 4,300
    digits, and on `"²"`, though `"²".isdigit()`)."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 16 else None


def hmac_hex(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def signed_by_any(secrets: Sequence[bytes], given: object, sign: Callable[[bytes], str]) -> bool:
    """Whether `given` is the signature `sign(secret)` makes with one of `secrets` (the current
    key, or the previous one during a rotation), compared in constant time."""
    return isinstance(given, str) and any(signatures_equal(sign(s), given) for s in secrets)


def _request_message(
    stamp: str | int, path: str, body: bytes, idempotency_key: str | None = None
) -> bytes:
    if idempotency_key is None:
        return f"{stamp}.{path}.".encode() + body
    return f"{stamp}.{path}\n{idempotency_key}\n".encode() + body


def sign_request(
    secret: bytes,
    body: bytes,
    *,
    path: str,
    timestamp: int | None = None,
    idempotency_key: str | None = None,
) -> dict[str, str]:
    """The headers that authenticate `body` sent to `path`; with `idempotency_key`, the signed
    `Idempotency-Key` header too."""
    stamp = int(time.time()) if timestamp is None else timestamp
    headers: dict[str, str] = {}
    if idempotency_key is not None:
        if IDEMPOTENCY_KEY.fullmatch(idempotency_key) is None:
            raise ValueError("an Idempotency-Key is 1-256 printable ASCII characters, no space")
        headers[IDEMPOTENCY_KEY_HEADER] = idempotency_key
    signature = hmac_hex(secret, _request_message(stamp, path, body, idempotency_key))
    return {TIMESTAMP_HEADER: str(stamp), SIGNATURE_HEADER: f"v1={signature}", **headers}


def standard_webhooks_secret(secret: bytes) -> str:
    """The webhook secret as a Standard Webhooks sender takes it: `whsec_<base64>`."""
    return "whsec_" + base64.b64encode(secret).decode()


def verify_request(
    secret: bytes,
    body: bytes,
    headers: Mapping[str, str],
    *,
    path: str,
    now: float | None = None,
    idempotency_key: str | None = None,
) -> str:
    """Check a signed request to `path` (and, if given, the `idempotency_key` it must sign);
    returns its signature (what makes it unique: the sidecar's idempotency keys come from it)."""
    stamp, signature = headers.get(TIMESTAMP_HEADER), headers.get(SIGNATURE_HEADER)
    if not stamp or not signature:
        raise SignatureError("missing signature headers")
    stamped = unix_seconds(stamp)
    if stamped is None:
        raise SignatureError("malformed timestamp")
    current = time.time() if now is None else now
    if abs(current - stamped) > TOLERANCE_SECONDS:
        raise SignatureError("timestamp outside the accepted window")
    if not signature.startswith("v1="):
        raise SignatureError("unknown signature version")
    if not path.isprintable():  # a newline would make the keyed message ambiguous
        raise SignatureError("malformed path")
    if idempotency_key is not None and IDEMPOTENCY_KEY.fullmatch(idempotency_key) is None:
        raise SignatureError("malformed Idempotency-Key")
    expected = hmac_hex(secret, _request_message(stamp, path, body, idempotency_key))
    if not signatures_equal(expected, signature.removeprefix("v1=")):
        raise SignatureError("signature does not match")
    return signature


def valid_recipient(recipient: str) -> bool:
    """A recipient (a person's address or name) is 1-256 printable characters, no control
    characters: it is shown on a page and written to the audit trail and the log."""
    return 0 < len(recipient) <= MAX_RECIPIENT_CHARS and recipient.isprintable()


def link_signature(
    secret: bytes,
    action: LinkAction,
    awakeable_id: str,
    expires: int,
    recipient: str | None = None,
) -> str:
    message = f"{action}:{awakeable_id}:{expires}"
    if recipient is not None:
        # Unambiguous: an awakeable id has no ':' and the expiry is digits only.
        message += f":{recipient}"
    return hmac_hex(secret, message.encode())


def signed_link(
    base_url: str,
    secret: bytes,
    action: LinkAction,
    awakeable_id: str,
    expires: int,
    recipient: str | None = None,
) -> str:
    """A link to the page that approves or denies the parked call until `expires`; with
    `recipient`, the person it is sent to (signed, shown on the page, recorded as the approver)."""
    params: dict[str, str | int] = {"exp": expires}
    if recipient is not None:
        if not valid_recipient(recipient):
            raise ValueError(
                f"a link's recipient must be 1-{MAX_RECIPIENT_CHARS} printable characters"
            )
        params["to"] = recipient
    params["sig"] = link_signature(secret, action, awakeable_id, expires, recipient)
    return f"{base_url.rstrip('/')}/v1/awakeables/{awakeable_id}/{action}?{urlencode(params)}"


def verify_link(
    secret: bytes,
    action: LinkAction,
    awakeable_id: str,
    expires: str,
    signature: str,
    now: float | None = None,
    recipient: str | None = None,
) -> None:
    until = unix_seconds(expires)
    if until is None:
        raise SignatureError("malformed expiry")
    if (time.time() if now is None else now) > until:
        raise SignatureError("link expired")
    if recipient is not None and not valid_recipient(recipient):
        raise SignatureError("malformed recipient")
    expected = link_signature(secret, action, awakeable_id, until, recipient)
    if not signatures_equal(expected, signature):
        raise SignatureError("signature does not match")


# -- between a sidecar and its worker --------------------------------------------------------
# Both go through Restate's ingress, which everything in the agent's pod reaches, the commands
# of the agent's tools included. These proofs need the webhook secret, which no tool can read:
# a tool can neither answer a parked call nor learn an awakeable id.


def answer_proof(secret: bytes, awakeable_id: str, answer: Mapping[str, object]) -> str:
    """HMAC-SHA256(secret, "tether-answer:v1:<awakeable id>:<the answer as canonical JSON>").
    No clock: it answers one call with one value, and a call takes only its first answer."""
    canonical = json.dumps(answer, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac_hex(secret, f"tether-answer:v1:{awakeable_id}:{canonical}".encode())


def delivery_claim(secret: bytes, awakeable_id: str, verb: str) -> str:
    """HMAC-SHA256(secret, "tether-claim:v1:<awakeable id>:<verb>"): what a claimed delivery id
    keeps of the call it answers, which it shows to whoever reaches the ingress (a tool too)
    without naming the call."""
    return hmac_hex(secret, f"tether-claim:v1:{awakeable_id}:{verb}".encode())


def verify_answer_proof(
    secret: bytes, awakeable_id: str, answer: Mapping[str, object], proof: str
) -> None:
    if not signatures_equal(answer_proof(secret, awakeable_id, answer), proof):
        raise SignatureError("the answer's proof does not match")


def listing_token(secret: bytes, now: float | None = None) -> dict[str, object]:
    """A read of the parked calls: `{"ts": <unix seconds>, "sig": HMAC(secret,
    "tether-parked:v1:<ts>")}`, accepted within `TOLERANCE_SECONDS`."""
    stamp = int(time.time() if now is None else now)
    return {"ts": stamp, "sig": hmac_hex(secret, f"tether-parked:v1:{stamp}".encode())}


def verify_listing_token(secret: bytes, token: object, now: float | None = None) -> None:
    if not isinstance(token, Mapping):
        raise SignatureError("no listing token")
    stamp, signature = token.get("ts"), token.get("sig")
    if not isinstance(stamp, int) or not isinstance(signature, str):
        raise SignatureError("malformed listing token")
    if abs((time.time() if now is None else now) - stamp) > TOLERANCE_SECONDS:
        raise SignatureError("listing token outside the accepted window")
    if not signatures_equal(hmac_hex(secret, f"tether-parked:v1:{stamp}".encode()), signature):
        raise SignatureError("listing token does not match")


EVENTS_TOKEN_SECONDS = 3600
"""How long a read token of a session's events works by default."""


def events_token(secret: bytes, agent: str, session: str, expires: int | None = None) -> str:
    """A read token of one session's event stream, `<exp>.<hex HMAC(secret,
    "tether-events:v1:<agent>:<session>:<exp>")>`, valid until `exp` (unix seconds)."""
    expires = int(time.time()) + EVENTS_TOKEN_SECONDS if expires is None else expires
    message = json.dumps(["tether-events:v1", agent, session, expires]).encode()
    return f"{expires}.{hmac_hex(secret, message)}"


def verify_events_token(
    secret: bytes, token: str, agent: str, session: str, now: float | None = None
) -> None:
    stamp, _, signature = token.partition(".")
    until = unix_seconds(stamp)
    if until is None or not signature:
        raise SignatureError("malformed events token")
    if until < (time.time() if now is None else now):
        raise SignatureError("the events token has expired")
    if not signatures_equal(
        events_token(secret, agent, session, until).partition(".")[2], signature
    ):
        raise SignatureError("the events token is not for this session")


def live_signature(secret: bytes, session: str, events: object) -> str:
    """HMAC(secret, "tether-live:v1:<session>:<events as canonical JSON>"): a worker's batch of
    live events, which only a holder of the secret may add to a session's stream."""
    canonical = json.dumps(events, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac_hex(secret, f"tether-live:v1:{session}:{canonical}".encode())


def live_signed(secrets: Sequence[bytes], session: str, events: object, signature: str) -> bool:
    """Whether one of `secrets` signed this batch of live events."""
    return signed_by_any(secrets, signature, lambda s: live_signature(s, session, events))


def handoff_signature(secret: bytes, nonce: str, call: str, note: Mapping[str, Any]) -> str:
    """HMAC(secret, ["tether-handoff:v1", nonce, call, done, beat, result] as canonical JSON): a
    worker hands the result of the tool body `call` of the intent `nonce` over (or says, in its
    `beat`-th heartbeat, that it still runs) to another replica
    (`tether.programs.worker.handoff`)."""
    done, beat, result = bool(note.get("done")), note.get("beat"), note.get("result")
    fields = ["tether-handoff:v1", nonce, call, done, beat, result]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hmac_hex(secret, canonical.encode())


def handoff_peek_signature(secret: bytes, nonce: str, call: str) -> str:
    """HMAC(secret, ["tether-handoff-peek:v1", nonce, call]): a worker asks for what was handed
    over of that body (its result is a tool's output: only a worker reads it)."""
    return hmac_hex(secret, json.dumps(["tether-handoff-peek:v1", nonce, call]).encode())


def pace_signature(secret: bytes, model: str, ask: Mapping[str, Any]) -> str:
    """HMAC(secret, ["tether-pace:v1", model, and the ask's fields]): a worker asks for the next
    slots of a model's calls (`tether.programs.worker.pace`); only a worker takes one."""
    fields = ("perMinute", "burst", "tokensPerMinute", "tokens", "stamp")
    signed = ["tether-pace:v1", model, *(ask.get(field) for field in fields)]
    return hmac_hex(secret, json.dumps(signed).encode())


def spend_signature(secret: bytes, request: Mapping[str, Any]) -> str:
    """HMAC(secret, ["tether-spend:v1", and the request's fields]): a worker holds a call's
    spend against the agent's caps, or settles it (`tether.programs.worker.spend`); only a
    worker does, never a tool that would take the caps' room or give it back. A hold's model is
    signed when it names one (a worker from before models had caps names none)."""
    fields = ("op", "hold", "amount", "caps", "stamp")
    signed = ["tether-spend:v1", *(request.get(field) for field in fields)]
    if "model" in request:
        signed.append(request["model"])
    return hmac_hex(secret, json.dumps(signed, sort_keys=True).encode())


def schedule_signature(secret: bytes, name: str, order: Mapping[str, Any]) -> str:
    """HMAC(secret, ["tether-schedule:v1", name, the order's schedule, owner, generation and
    stamp]): the operator sets or stops a schedule of the agent
    (`tether.programs.worker.schedule`); nothing else, the agent's own tools least of all, may
    start its runs at times of its own."""
    schedule = json.dumps(order.get("schedule"), sort_keys=True)
    fields = (order.get("owner"), order.get("generation"), order.get("stamp"))
    return hmac_hex(secret, json.dumps(["tether-schedule:v1", name, schedule, *fields]).encode())


def schedule_order(
    secret: bytes,
    name: str,
    schedule: Mapping[str, Any] | None,
    *,
    owner: str,
    generation: int,
    stamp: float,
) -> dict[str, Any]:
    """The operator's order to set the schedule `name` (a `ScheduleSpec`'s JSON) or, with None,
    to stop it, as of the `generation` of the DurableAgent whose uid is `owner`, signed."""
    order = {"schedule": schedule, "owner": owner, "generation": generation, "stamp": stamp}
    return {**order, "sig": schedule_signature(secret, name, order)}


def schedule_run_signature(secret: bytes, name: str, order: Mapping[str, Any]) -> str:
    """HMAC(secret, ["tether-schedule-run:v1", name, the order's request, owner and stamp]): the
    operator starts a run of the schedule `name` now, as a person asked (`tether.dev/run-now`)."""
    fields = (order.get("request"), order.get("owner"), order.get("stamp"))
    return hmac_hex(secret, json.dumps(["tether-schedule-run:v1", name, *fields]).encode())


def schedule_run_order(
    secret: bytes, name: str, request: str, *, owner: str, stamp: float
) -> dict[str, Any]:
    """The operator's order to start a run of the schedule `name` now, once for `request`, for
    the DurableAgent whose uid is `owner`, signed."""
    order = {"request": request, "owner": owner, "stamp": stamp}
    return {**order, "sig": schedule_run_signature(secret, name, order)}


def watch_tag(secret: bytes, session: str) -> str:
    """HMAC(secret, "tether-watch:v1:<session>"), 32 hex digits: a watched session as the
    sidecar registers it in `<agent>-watchers` and the workers ask about it, through the
    ingress: by a tag that only holders of the secret can make, not by its id."""
    return hmac_hex(secret, f"tether-watch:v1:{session}".encode())[:32]


def watch_signature(secret: bytes, tags: Sequence[str], stamp: int) -> str:
    """HMAC(secret, ["tether-watch-set:v1", stamp, tags]): a sidecar registers the sessions its
    clients stream (`tether.programs.worker.watchers`); only a sidecar does, never a tool that
    would push the real ones out of the set with tags of its own."""
    return hmac_hex(secret, json.dumps(["tether-watch-set:v1", stamp, list(tags)]).encode())


def watch_request(secret: bytes, tags: Sequence[str], stamp: int | None = None) -> dict[str, Any]:
    """What a sidecar sends to register `tags` at `stamp` (epoch ms; now by default)."""
    stamp = time.time_ns() // 1_000_000 if stamp is None else stamp
    return {"tags": list(tags), "stamp": stamp, "sig": watch_signature(secret, tags, stamp)}


def watch_tags(secrets: tuple[bytes, ...], session: str) -> tuple[str, ...]:
    """`session`'s tag under each of `secrets` (the current and, during a rotation, the
    previous): a sidecar registers them all, so a worker on either secret finds the session."""
    return tuple(watch_tag(secret, session) for secret in secrets)


def verified_by_any(
    secrets: Sequence[bytes], verify: Callable[..., T], *args: Any, **kwargs: Any
) -> T:
    """`verify(secret, *args, **kwargs)` with the first of `secrets` that it accepts (the
    current key, then the previous one during a rotation); the current key's error otherwise."""
    if not secrets:
        raise SignatureError("no webhook secret is set")
    first: SignatureError | None = None
    for secret in secrets:
        try:
            return verify(secret, *args, **kwargs)
        except SignatureError as error:
            first = first or error
    assert first is not None
    raise first
