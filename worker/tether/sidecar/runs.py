"""`POST /v1/sessions/{session}/runs`: start (or queue) a run of the agent from a signed webhook.

The body is the run request, `{"prompt": "..."}`, signed like the awakeable webhooks. The run is
sent to the agent's `run` handler through Restate's ingress, which queues it behind a run of the
same session that is still going on (the session's turns carry over). An `Idempotency-Key`
header is passed to Restate, so a sender that retries a delivery starts one run, not two: the
answer then says `PreviouslyAccepted` with the same invocation id.
"""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from .auth import authenticate_request
from .body import parse_json, read_limited_body, require_json_content_type
from .context import SidecarDep
from .rejection import Rejection, count

router = APIRouter()
SESSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
IDEMPOTENCY_KEY = re.compile(r"[\x21-\x7e]{1,256}")


@router.post("/v1/sessions/{session_id}/runs")
async def start_run(session_id: str, request: Request, sidecar: SidecarDep) -> JSONResponse:
    """Start a run of the agent in `session_id` with the signed `{"prompt": ...}` body."""
    if SESSION_ID.fullmatch(session_id) is None:
        raise Rejection(400, "bad_id", "malformed session id: 1-128 of A-Z a-z 0-9 _ . : -")
    require_json_content_type(request.headers)
    body = await read_limited_body(
        request.receive, request.headers, sidecar.settings.max_body_bytes
    )
    signature, timestamp = authenticate_request(
        sidecar.settings.secret, body, request.headers, request.url.path
    )
    value = parse_json(body)
    prompt = value.get("prompt") if isinstance(value, dict) else None
    if not isinstance(prompt, str) or not prompt.strip() or set(value) != {"prompt"}:
        raise Rejection(400, "bad_body", 'expected {"prompt": "<the task>"}')
    key = request.headers.get("idempotency-key")
    if key is not None and IDEMPOTENCY_KEY.fullmatch(key) is None:
        raise Rejection(400, "bad_body", "malformed Idempotency-Key: 1-256 printable characters")
    sidecar.replay_guard.claim(signature, timestamp)
    try:
        sent = await sidecar.restate.send_run(sidecar.settings.agent, session_id, body, key)
    except BaseException:
        sidecar.replay_guard.release(signature)  # nothing was started: the sender may retry
        raise
    count("run_started")
    return JSONResponse(
        {"session": session_id, "invocation_id": sent["invocationId"], "status": sent["status"]},
        status_code=202,
    )
