"""The two signed webhooks as plain ASGI middleware in front of the FastAPI routes:

    POST /v1/awakeables/{id}/resolve    the JSON body is the awakeable's value
    POST /v1/awakeables/{id}/reject     {"reason": "..."}; the waiting call fails with it

Each is signed with Tether's `X-Tether-Signature` (`tether.programs.webhooks`), or with the
Standard Webhooks scheme (`standard_webhooks`), whose `webhook-id` is claimed in Restate for the
call as soon as its signature verifies: it acts on that call only, through every replica.

A resolution that names its `approver` (a JSON object with `"approver": "<1-256 printable
characters>"`) gets `decided_at` (epoch ms, when the sidecar accepted it) unless it has one, so
the value Restate keeps says who decided and when; any other value is passed on as it is.

Every answer to a parked call passes here, and FastAPI's per-request machinery (Request objects,
dependency solving, routing, responses) cost about as much CPU as all the work below; so this
reads the ASGI scope directly. An answer reaches Restate only after every check passed: the id
is well formed, the body is JSON within the size limit, the signature is valid, fresh and not
seen before by this process, this process has not answered the id yet, and the id is parked by
this agent (a Standard Webhooks delivery's id is claimed before these). Then it goes to the
agent's index (`<agent>-parked/all/answer`) under the call's idempotency key (`Sidecar.answer`):
a call answered before, through any replica or before a restart, is 409.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ..webhooks import MAX_RECIPIENT_CHARS, valid_recipient
from .awakeable_id import checked_awakeable_id, loggable_id
from .body import read_signed_json
from .context import Sidecar
from .rejection import Rejection, count, refused
from .standard_webhooks import read_standard_webhook, signed_with_standard_webhooks

PREFIX = "/v1/awakeables/"
ROUTE = PREFIX + "{awakeable_id:path}/"  # how refusals are logged (never the raw path)
MAX_REASON_CHARS = 2000
JSON_HEADERS = [(b"content-type", b"application/json")]


class SignedPosts:
    def __init__(self, app: ASGIApp, sidecar: Sidecar) -> None:
        self.app = app
        self.sidecar = sidecar

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] != "http" or scope["method"] != "POST" or not path.startswith(PREFIX):
            return await self.app(scope, receive, send)
        raw_id, _, verb = path[len(PREFIX) :].rpartition("/")
        if verb not in ("resolve", "reject"):
            return await self.app(scope, receive, send)
        extra: list[tuple[bytes, bytes]] = []  # a refusal's own headers
        try:
            awakeable_id = checked_awakeable_id(raw_id)
            await self._answer(awakeable_id, verb, path, scope, receive)
            status, answer = 202, {"awakeable_id": awakeable_id, "status": f"{verb}d"}
        except Rejection as error:
            client = scope.get("client")
            refused(
                error,
                method="POST",
                route=ROUTE + verb,
                logged_id=loggable_id(raw_id),
                client=client[0] if client else None,
            )
            status, answer = error.status, {"error": error.message, "outcome": error.outcome}
            extra = [(k.encode(), v.encode()) for k, v in error.headers.items()]
        body = orjson.dumps(answer)
        headers = [*JSON_HEADERS, (b"content-length", str(len(body)).encode()), *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _answer(
        self, awakeable_id: str, verb: str, path: str, scope: Scope, receive: Receive
    ) -> None:
        sidecar = self.sidecar
        settings = sidecar.settings
        headers = Headers(scope=scope)
        if signed_with_standard_webhooks(headers):
            value, delivery, timestamp = await read_standard_webhook(
                receive, headers, settings.secrets, settings.max_body_bytes
            )
            signature = f"webhook-id:{delivery}"  # what the replay guard knows it by
            # Its signature covers neither the path nor the call: the id binds it to this call,
            # before anything can refuse it (refused, it could otherwise answer another).
            await sidecar.claim_delivery(delivery, awakeable_id, verb)
        else:
            _, value, signature, timestamp = await read_signed_json(
                receive, headers, path, settings.secrets, settings.max_body_bytes
            )
        approver = None
        if verb == "resolve":
            approver = _approver(value)
            if approver is not None and "decided_at" not in value:
                value["decided_at"] = int(time.time() * 1000)
            answer_of: dict[str, Any] = {"value": value}
        else:
            reason = value.get("reason") if isinstance(value, dict) else None
            if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON_CHARS:
                raise Rejection(
                    400, "bad_body", f'expected {{"reason": "<1-{MAX_REASON_CHARS} characters>"}}'
                )
            answer_of = {"reject": reason}

        async def answer() -> None:
            await sidecar.answer(awakeable_id, f"{verb}d by webhook", answer_of, approver=approver)

        await sidecar.once(signature, timestamp, answer)
        count("resolved" if verb == "resolve" else "rejected")


def _approver(value: Any) -> str | None:
    """The `approver` a resolution names, if any (400 if it is not a short printable text)."""
    if not isinstance(value, dict) or "approver" not in value:
        return None
    approver = value["approver"]
    if not isinstance(approver, str) or not valid_recipient(approver):
        raise Rejection(
            400, "bad_body", f'"approver" must be 1-{MAX_RECIPIENT_CHARS} printable characters'
        )
    return approver
