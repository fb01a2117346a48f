"""Answering parked calls: signed webhooks that resolve or reject an awakeable, one-click signed
links that approve or deny, and the list of the agent's parked calls.

A request reaches Restate's ingress only after every check passed: the id is well formed, the
body is JSON within the size limit, the signature is valid, fresh and not seen before, this
sidecar has not answered the id yet, and the id is parked by this agent (read from Restate).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, JSONResponse

from ..metrics import WEBHOOK_REQUESTS
from ..webhooks import LinkAction
from .auth import authenticate_link, authenticate_request
from .awakeable_id import checked_awakeable_id
from .body import parse_json, read_limited_body, require_json_content_type
from .context import Sidecar, SidecarDep
from .pages import link_page
from .rejection import Outcome, Rejection

log = logging.getLogger("tether.sidecar")
router = APIRouter()
AWAKEABLE = "/v1/awakeables/{awakeable_id:path}"
MAX_REASON_CHARS = 2000


def count(outcome: Outcome) -> None:
    WEBHOOK_REQUESTS.labels(outcome).inc()


async def _signed_json_body(request: Request, sidecar: Sidecar) -> tuple[bytes, Any, str, int]:
    """The raw body, its JSON value, and the request's signature and timestamp."""
    require_json_content_type(request)
    body = await read_limited_body(request, sidecar.settings.max_body_bytes)
    signature, timestamp = authenticate_request(
        sidecar.settings.secret, body, request.headers, request.url.path
    )
    return body, parse_json(body), signature, timestamp


async def _answer(
    sidecar: Sidecar, awakeable_id: str, how: str, forward: Callable[[], Awaitable[None]]
) -> None:
    """Answer a parked call once: ledger claim, parked check, then Restate."""
    sidecar.ledger.claim(awakeable_id)
    try:
        await sidecar.parked.require(awakeable_id)
        await forward()
    except BaseException:
        sidecar.ledger.release(awakeable_id)
        raise
    sidecar.ledger.done(awakeable_id, how)
    sidecar.parked.forget(awakeable_id)
    log.info("awakeable %s %s", awakeable_id, how)


async def _answer_signed(
    sidecar: Sidecar,
    awakeable_id: str,
    signature: str,
    timestamp: int,
    how: str,
    forward: Callable[[], Awaitable[None]],
) -> None:
    sidecar.replay_guard.claim(signature, timestamp)
    try:
        await _answer(sidecar, awakeable_id, how, forward)
    except BaseException:
        sidecar.replay_guard.release(signature)  # nothing happened: the sender may retry
        raise


@router.post(f"{AWAKEABLE}/resolve")
async def resolve(awakeable_id: str, request: Request, sidecar: SidecarDep) -> JSONResponse:
    """Resolve the awakeable with the JSON body as its value (HMAC-signed request)."""
    awakeable_id = checked_awakeable_id(awakeable_id)
    body, _, signature, timestamp = await _signed_json_body(request, sidecar)

    async def forward() -> None:
        await sidecar.restate.resolve_awakeable(awakeable_id, body)

    await _answer_signed(
        sidecar, awakeable_id, signature, timestamp, "resolved by webhook", forward
    )
    count("resolved")
    return JSONResponse({"awakeable_id": awakeable_id, "status": "resolved"}, status_code=202)


@router.post(f"{AWAKEABLE}/reject")
async def reject(awakeable_id: str, request: Request, sidecar: SidecarDep) -> JSONResponse:
    """Reject the awakeable with `{"reason": "..."}` (HMAC-signed request)."""
    awakeable_id = checked_awakeable_id(awakeable_id)
    _, value, signature, timestamp = await _signed_json_body(request, sidecar)
    reason = value.get("reason") if isinstance(value, dict) else None
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON_CHARS:
        raise Rejection(
            400, "bad_body", f'expected {{"reason": "<1-{MAX_REASON_CHARS} characters>"}}'
        )

    async def forward() -> None:
        await sidecar.restate.reject_awakeable(awakeable_id, reason)

    await _answer_signed(
        sidecar, awakeable_id, signature, timestamp, "rejected by webhook", forward
    )
    count("rejected")
    return JSONResponse({"awakeable_id": awakeable_id, "status": "rejected"}, status_code=202)


async def _follow_link(
    action: LinkAction,
    awakeable_id: str,
    exp: str | None,
    sig: str | None,
    sidecar: Sidecar,
) -> HTMLResponse:
    awakeable_id = checked_awakeable_id(awakeable_id)
    authenticate_link(sidecar.settings.secret, action, awakeable_id, exp, sig)
    approved = action == "approve"
    value = json.dumps({"approved": approved, "by": "link"}).encode()

    async def forward() -> None:
        await sidecar.restate.resolve_awakeable(awakeable_id, value)

    how = "approved by link" if approved else "denied by link"
    await _answer(sidecar, awakeable_id, how, forward)
    count("approved" if approved else "denied")
    if approved:
        return link_page(200, "Approved", "The call was approved; the agent goes on.")
    return link_page(200, "Denied", "The call was denied; the agent is told so.")


@router.get(f"{AWAKEABLE}/approve")
async def approve_link(
    awakeable_id: str,
    sidecar: SidecarDep,
    exp: str | None = None,
    sig: str | None = None,
) -> HTMLResponse:
    """One-click approval: resolves with `{"approved": true, "by": "link"}`."""
    return await _follow_link("approve", awakeable_id, exp, sig, sidecar)


@router.get(f"{AWAKEABLE}/deny")
async def deny_link(
    awakeable_id: str,
    sidecar: SidecarDep,
    exp: str | None = None,
    sig: str | None = None,
) -> HTMLResponse:
    """One-click denial: resolves with `{"approved": false, "by": "link"}`."""
    return await _follow_link("deny", awakeable_id, exp, sig, sidecar)


@router.get("/v1/approvals")
async def list_parked_calls(request: Request, sidecar: SidecarDep) -> JSONResponse:
    """The agent's parked calls in all sessions, oldest first. Signed like a webhook POST, with
    an empty body (the records show tool inputs)."""
    authenticate_request(sidecar.settings.secret, b"", request.headers, request.url.path)
    records = await sidecar.parked.all()
    waiting = [r for r in records.values() if r["awakeable_id"] not in sidecar.ledger]
    parked = sorted(waiting, key=lambda r: (r.get("created_at", 0), r["awakeable_id"]))
    count("listed")
    return JSONResponse({"agent": sidecar.settings.agent, "parked": parked})
