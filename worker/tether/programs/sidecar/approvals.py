"""Signed links that approve or deny a parked call, and the list of the agent's parked calls.
(The signed webhook POSTs are `signed_posts`.)

A link is a capability, and people post it where robots fetch it (chat and mail previews, link
scanners), so opening it decides nothing:

    GET  /v1/awakeables/{id}/approve?exp=..&sig=..[&to=..]   the page: the call, its input, who
                                                             asks, until when; the buttons
    POST /v1/awakeables/{id}/approve                         the page's form: the decision

(and `/deny`). The GET checks the link and shows the parked call read from Restate; HEAD and
anything but the page's form act on nothing. The POST carries the link's parameters back, and
every check runs again: the form comes from the page (`link_form`), the link is signed and not
expired, the form's token was made for this link's page, an approve link for an approval (a deny
link may only deny), this sidecar has not answered the id yet, and the id is parked by this
agent. Only then does the resolution reach Restate, as `{"approved": bool, "by": "link",
"approver": <the link's recipient or null>, "decided_at": <epoch ms>}`, once: through the
agent's index (`<agent>-parked/all/answer`) under the call's idempotency key
(`Sidecar.answer`), so a call answered before through another replica (or before a restart) is
refused with 409.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, JSONResponse

from ..webhooks import LinkAction
from .auth import authenticate_link, authenticate_request
from .awakeable_id import checked_awakeable_id
from .context import Sidecar, SidecarDep
from .link_form import (
    FORM_TOKEN_SECONDS,
    check_form_token,
    form_token,
    read_link_form,
    require_same_origin,
)
from .pages import LinkView, confirmation_page, link_page
from .rejection import Rejection, count

router = APIRouter()
AWAKEABLE = "/v1/awakeables/{awakeable_id:path}"


async def _show_link(
    action: LinkAction,
    awakeable_id: str,
    exp: str | None,
    sig: str | None,
    to: str | None,
    sidecar: Sidecar,
) -> HTMLResponse:
    awakeable_id = checked_awakeable_id(awakeable_id)
    secret = sidecar.settings.secret
    authenticate_link(sidecar.settings.secrets, action, awakeable_id, exp, sig, to)
    assert exp is not None and sig is not None
    sidecar.ledger.require_open(awakeable_id)
    record = await sidecar.parked.require(awakeable_id)
    view = LinkView(
        action=action,
        record=record,
        expires=int(exp),
        signature=sig,
        recipient=to,
        token=form_token(secret, action, awakeable_id, sig),
    )
    count("shown")
    return confirmation_page(view, FORM_TOKEN_SECONDS)


async def _decide(
    action: LinkAction, awakeable_id: str, request: Request, sidecar: Sidecar
) -> HTMLResponse:
    awakeable_id = checked_awakeable_id(awakeable_id)
    require_same_origin(request.headers, request.url.scheme)
    form = await read_link_form(request.receive, request.headers)
    secrets = sidecar.settings.secrets
    authenticate_link(secrets, action, awakeable_id, form.exp, form.sig, form.to)
    assert form.sig is not None
    check_form_token(secrets, action, awakeable_id, form.sig, form.token)
    if form.decision not in ("approve", "deny"):
        raise Rejection(400, "bad_body", "the form has no decision (approve or deny)")
    if form.decision == "approve" and action != "approve":
        raise Rejection(403, "bad_signature", "refused: a deny link cannot approve the call")
    approved = form.decision == "approve"
    value = {
        "approved": approved,
        "by": "link",
        "approver": form.to,
        "decided_at": int(time.time() * 1000),
    }
    how = "approved by link" if approved else "denied by link"
    await sidecar.answer(awakeable_id, how, {"value": value}, approver=form.to)
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
    to: str | None = None,
) -> HTMLResponse:
    """The page of an approve link: the call and its Approve and Deny buttons. Decides nothing."""
    return await _show_link("approve", awakeable_id, exp, sig, to, sidecar)


@router.get(f"{AWAKEABLE}/deny")
async def deny_link(
    awakeable_id: str,
    sidecar: SidecarDep,
    exp: str | None = None,
    sig: str | None = None,
    to: str | None = None,
) -> HTMLResponse:
    """The page of a deny link: the call and its Deny button. Decides nothing."""
    return await _show_link("deny", awakeable_id, exp, sig, to, sidecar)


@router.post(f"{AWAKEABLE}/approve")
async def approve_form(awakeable_id: str, request: Request, sidecar: SidecarDep) -> HTMLResponse:
    """The form of an approve link's page: resolves with `{"approved": <the button>, ...}`."""
    return await _decide("approve", awakeable_id, request, sidecar)


@router.post(f"{AWAKEABLE}/deny")
async def deny_form(awakeable_id: str, request: Request, sidecar: SidecarDep) -> HTMLResponse:
    """The form of a deny link's page: resolves with `{"approved": false, ...}`."""
    return await _decide("deny", awakeable_id, request, sidecar)


@router.get("/v1/approvals")
async def list_parked_calls(request: Request, sidecar: SidecarDep) -> JSONResponse:
    """The agent's parked calls in all sessions, oldest first. Signed like a webhook POST, with
    an empty body (the records show tool inputs)."""
    authenticate_request(sidecar.settings.secrets, b"", request.headers, request.scope["path"])
    records = await sidecar.parked.all()
    waiting = [r for r in records.values() if r["awakeable_id"] not in sidecar.ledger]
    parked = sorted(waiting, key=lambda r: (r.get("created_at", 0), r["awakeable_id"]))
    count("listed")
    return JSONResponse({"agent": sidecar.settings.agent, "parked": parked})
