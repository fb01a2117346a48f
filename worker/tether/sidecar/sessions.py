"""Signed webhooks that talk to a session of the agent:

    POST /v1/sessions/{session}/runs        {"prompt": "..."}  start (or queue) a run
    POST /v1/sessions/{session}/messages    {"text": "..."}    a message for the running agent

Both are signed like the awakeable webhooks and pass the same replay guard. A run goes to the
agent's `run` handler through Restate's ingress, which queues it behind a run of the same session
still going on (the session's turns carry over); an `Idempotency-Key` header is passed to
Restate, so a sender that retries a delivery starts one run, not two (the answer then says
`PreviouslyAccepted`, with the same invocation id). A message goes to the session's inbox
(`tether.worker.inbox`); the run reads it at its next turn boundary.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from .body import read_signed_json
from .context import Sidecar, SidecarDep
from .rejection import Rejection, count

router = APIRouter()
SESSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,256}")


async def _signed_text_field(
    request: Request, sidecar: Sidecar, session_id: str, field: str
) -> tuple[bytes, str, int]:
    """The raw body, signature and timestamp of a signed `{field: "<text>"}` request."""
    if SESSION_ID.fullmatch(session_id) is None:
        raise Rejection(400, "bad_id", "malformed session id: 1-128 of A-Z a-z 0-9 _ . : -")
    settings = sidecar.settings
    body, value, signature, timestamp = await read_signed_json(
        request.receive, request.headers, request.url.path, settings.secret, settings.max_body_bytes
    )
    text = value.get(field) if isinstance(value, dict) else None
    if not isinstance(text, str) or not text.strip() or set(value) != {field}:
        raise Rejection(400, "bad_body", f'expected {{"{field}": "<text>"}}')
    return body, signature, timestamp


@router.post("/v1/sessions/{session_id}/runs")
async def start_run(session_id: str, request: Request, sidecar: SidecarDep) -> JSONResponse:
    """Start a run of the agent in `session_id` with the signed `{"prompt": ...}` body."""
    body, signature, timestamp = await _signed_text_field(request, sidecar, session_id, "prompt")
    key = request.headers.get("idempotency-key")
    if key is not None and IDEMPOTENCY_KEY.fullmatch(key) is None:
        raise Rejection(400, "bad_body", "malformed Idempotency-Key: 1-256 printable characters")

    async def send() -> Any:
        return await sidecar.restate.send_run(sidecar.settings.agent, session_id, body, key)

    sent = await sidecar.once(signature, timestamp, send)
    count("run_started")
    return JSONResponse(
        {"session": session_id, "invocation_id": sent["invocationId"], "status": sent["status"]},
        status_code=202,
    )


@router.post("/v1/sessions/{session_id}/messages")
async def post_message(session_id: str, request: Request, sidecar: SidecarDep) -> JSONResponse:
    """Leave the signed `{"text": ...}` for the agent running in `session_id`."""
    body, signature, timestamp = await _signed_text_field(request, sidecar, session_id, "text")

    async def send() -> Any:
        return await sidecar.restate.post_message(sidecar.settings.agent, session_id, body)

    posted = await sidecar.once(signature, timestamp, send)
    count("message_posted")
    return JSONResponse({"session": session_id, "waiting": posted["waiting"]}, status_code=202)
