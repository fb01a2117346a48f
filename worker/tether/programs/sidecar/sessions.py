"""Signed webhooks that talk to a session of the agent:

    POST /v1/sessions/{session}/runs        {"prompt": "..."}  start (or queue) a run
    POST /v1/sessions/{session}/messages    {"text": "..."}    a message for the running agent

Both are signed like the awakeable webhooks, and each acts at most once however many replicas
of the sidecar there are and however often they restart: the sidecar sends it to Restate under
an idempotency key, and Restate, where the state lives, starts nothing for a key it has seen.

- A run goes to the agent's `run` handler (`/send`), which Restate queues behind a run of the same
  session still going on (the session's turns carry over). Its key is the request's
  `Idempotency-Key` header when it has one, which the signature must then cover
  (`tether.programs.webhooks`: a request whose header was dropped or changed is refused as
  unsigned); otherwise a key derived from the signature (`auth.signature_key`). So a sender that
  retries a delivery with its key, even signed anew, starts one run: 202 with `PreviouslyAccepted`
  and the first run's invocation id. A request without a key that reaches Restate again (the same
  signature, through any replica) is a replay: 409 `replayed`, and it learns nothing of the run.
- A message goes to the session's inbox (`tether.programs.worker.inbox`, `post` sent under the
  signature's key); the run reads it at its next turn boundary. The same signed message again,
  through any replica, is 409 `replayed`: delivered once.

The retention of those keys in Restate (the worker sets `idempotency_retention` on the handlers:
1 day) is far longer than the time a signature is accepted (`TOLERANCE_SECONDS` either side of
its timestamp: 10 minutes in all), so no replay can outlive its key.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from ..webhooks import IDEMPOTENCY_KEY, IDEMPOTENCY_KEY_HEADER
from .auth import signature_key
from .body import read_signed_json
from .context import Sidecar, SidecarDep
from .rejection import Outcome, Rejection, count
from .restate_client import ACCEPTED

router = APIRouter()
SESSION_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
MAX_MESSAGE_CHARS = 20_000
"""The inbox's limit (`tether.programs.worker.inbox.MAX_MESSAGE_CHARS`), checked before Restate is
asked."""
INBOX_REFUSALS: dict[int, Outcome] = {400: "bad_body", 429: "too_many"}
"""How the inbox refuses a message, passed on as it is: a text no run could store; a session
whose inbox already holds `MAX_WAITING` messages."""


async def _signed_text_field(
    request: Request,
    sidecar: Sidecar,
    session_id: str,
    field: str,
    idempotency_key: str | None = None,
    optional: frozenset[str] = frozenset(),
) -> tuple[bytes, dict[str, Any], str, int]:
    """The raw body, value, signature and timestamp of a signed `{field: "<text>"}` request
    (with the keys in `optional`, if it has them)."""
    if SESSION_ID.fullmatch(session_id) is None:
        raise Rejection(400, "bad_id", "malformed session id: 1-128 of A-Z a-z 0-9 _ . : -")
    settings = sidecar.settings
    body, value, signature, timestamp = await read_signed_json(
        request.receive,
        request.headers,
        request.scope["path"],  # what routed it (never the Host header's)
        settings.secrets,
        settings.max_body_bytes,
        idempotency_key,
    )
    text = value.get(field) if isinstance(value, dict) else None
    if (
        not isinstance(text, str)
        or not text.strip()
        or not {field} <= set(value) <= {field, *optional}
    ):
        raise Rejection(400, "bad_body", f'expected {{"{field}": "<text>"}}')
    return body, value, signature, timestamp


def _check_fork(fork: Any) -> None:
    """A run's `fork`: `{"session": <id>, "turns": <n>}` (`turns` optional), checked here so a
    malformed one is refused before Restate is asked."""
    turns = fork.get("turns") if isinstance(fork, dict) else None
    if (
        not isinstance(fork, dict)
        or not set(fork) <= {"session", "turns"}
        or not isinstance(fork.get("session"), str)
        or SESSION_ID.fullmatch(fork["session"]) is None
        or (turns is not None and (type(turns) is not int or turns < 1))
    ):
        raise Rejection(
            400, "bad_body", 'expected "fork": {"session": "<session id>", "turns": <n > 0>}'
        )


@router.post("/v1/sessions/{session_id}/runs")
async def start_run(session_id: str, request: Request, sidecar: SidecarDep) -> JSONResponse:
    """Start a run of the agent in `session_id` with the signed `{"prompt": ...}` body; with
    `"fork": {"session": ..., "turns": ...}`, `session_id` is a new session that starts with
    those turns of another."""
    key = request.headers.get(IDEMPOTENCY_KEY_HEADER)
    if key is not None and IDEMPOTENCY_KEY.fullmatch(key) is None:
        raise Rejection(400, "bad_body", "malformed Idempotency-Key: 1-256 printable characters")
    body, value, signature, timestamp = await _signed_text_field(
        request, sidecar, session_id, "prompt", key, optional=frozenset({"fork"})
    )
    if "fork" in value:
        _check_fork(value["fork"])
    agent = sidecar.settings.agent

    async def send() -> Any:
        return await sidecar.restate.send_run(agent, session_id, body, signature_key(signature))

    if key is not None:
        # The sender's own key: a retry of it (a replay too) is the same run, answered as such.
        sent = await sidecar.restate.send_run(agent, session_id, body, key)
    else:
        sent = await sidecar.once(signature, timestamp, send)
        if sent["status"] != ACCEPTED:
            raise Rejection(409, "replayed", "this signed request was already received")
    count("run_started")
    return JSONResponse(
        {"session": session_id, "invocation_id": sent["invocationId"], "status": sent["status"]},
        status_code=202,
    )


@router.post("/v1/sessions/{session_id}/messages")
async def post_message(session_id: str, request: Request, sidecar: SidecarDep) -> JSONResponse:
    """Leave the signed `{"text": ...}` for the agent running in `session_id`."""
    body, value, signature, timestamp = await _signed_text_field(
        request, sidecar, session_id, "text"
    )
    text = value["text"]
    if len(text) > MAX_MESSAGE_CHARS:
        raise Rejection(400, "bad_body", f"the text is longer than {MAX_MESSAGE_CHARS} characters")
    agent = sidecar.settings.agent

    async def send() -> Any:
        return await sidecar.restate.send_message(agent, session_id, body, signature_key(signature))

    sent = await sidecar.once(signature, timestamp, send)
    if sent["status"] != ACCEPTED:
        raise Rejection(409, "replayed", "this signed message was already delivered")
    posted = await sidecar.restate.output(sent["invocationId"], INBOX_REFUSALS)
    count("message_posted")
    return JSONResponse({"session": session_id, "waiting": posted["waiting"]}, status_code=202)
