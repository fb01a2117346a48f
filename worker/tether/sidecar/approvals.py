"""One-click signed links that approve or deny a parked call, and the list of the agent's
parked calls. (The signed webhook POSTs are `signed_posts`.)

A link reaches Restate's ingress only after every check passed: the id is well formed, the link
is signed and not expired, this sidecar has not answered the id yet, and the id is parked by
this agent (read from Restate).
"""

from __future__ import annotations

import json

from fastapi import APIRouter, Request
from starlette.responses import HTMLResponse, JSONResponse

from ..webhooks import LinkAction
from .auth import authenticate_link, authenticate_request
from .awakeable_id import checked_awakeable_id
from .context import Sidecar, SidecarDep
from .pages import link_page
from .rejection import count

router = APIRouter()
AWAKEABLE = "/v1/awakeables/{awakeable_id:path}"


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
    await sidecar.answer(awakeable_id, how, forward)
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
