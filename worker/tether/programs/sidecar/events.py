"""`GET /v1/sessions/{session}/events`: a session's event stream as Server-Sent Events.

Any replica serves any session: the events live in Restate (the durable ones in the agent's
object, the live ones in `<agent>-live`; `tether.session.events`), and the sidecar polls them,
often while they flow and less when the session is quiet. Each SSE message's `id` (and the
event's `cursor`) is the reader's place after it (`tether.session.events.Cursor`), so a client
that reconnects with `Last-Event-ID` (or `?after=`), to any replica, gets every durable event it
has not had exactly once, and the live ones still kept. While a stream is open its session is
registered in `<agent>-watchers` (`watching`): the workers send the live events of watched
sessions only (`tether.programs.worker.live`).

Reading needs a token for the session: `?token=` (what a browser's `EventSource` can send) or
`Authorization: Bearer`, minted with the webhook secret (`webhooks.events_token`, `tether watch`,
`tether events-url`), until it expires.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from ...session.events import Cursor, unseen
from ..webhooks import SignatureError, verified_by_any, verify_events_token
from .context import Sidecar, SidecarDep
from .rejection import Rejection
from .sessions import SESSION_ID

router = APIRouter()

FAST_POLL = 0.05
"""Seconds between reads while events flow."""
SLOW_POLL = 1.0
"""The longest wait between reads of a quiet session."""
KEEPALIVE_SECONDS = 15.0
"""A comment line this often keeps proxies from closing a quiet stream."""


def _token(request: Request) -> str:
    token = request.query_params.get("token")
    header = request.headers.get("authorization", "")
    if not token and header.lower().startswith("bearer "):
        token = header[7:].strip()
    if not token:
        raise Rejection(401, "bad_token", "a read token is required (?token= or Bearer)")
    return token


def _frame(event: dict[str, Any], cursor: Cursor) -> bytes:
    data = json.dumps({**event, "cursor": str(cursor)}, separators=(",", ":"))
    return f"id: {cursor}\nevent: {event['type']}\ndata: {data}\n\n".encode()


async def _stream(sidecar: Sidecar, session: str, cursor: Cursor) -> AsyncIterator[bytes]:
    # Registered before the first byte: the live events of what runs from now on are sent.
    await sidecar.watching.start(session)
    try:
        async for frame in _frames(sidecar, session, cursor):
            yield frame
    finally:
        sidecar.watching.stop(session)


async def _frames(sidecar: Sidecar, session: str, cursor: Cursor) -> AsyncIterator[bytes]:
    yield b"retry: 1000\n\n"
    agent = sidecar.settings.agent
    wait = FAST_POLL
    quiet_since = time.monotonic()
    while True:
        try:
            events = await sidecar.restate.session_events(agent, session, str(cursor))
        except Rejection:
            events = []  # Restate restarting: the client keeps its place, we try again
        fresh = unseen(cursor, events)
        for event in fresh:
            cursor = cursor.past(event)
            yield _frame(event, cursor)
        if fresh:
            wait, quiet_since = FAST_POLL, time.monotonic()
        else:
            wait = min(SLOW_POLL, wait * 1.5)
            if time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
                quiet_since = time.monotonic()
                yield b": keep-alive\n\n"
        await asyncio.sleep(wait)


@router.get("/v1/sessions/{session_id}/events")
async def session_events(session_id: str, request: Request, sidecar: SidecarDep) -> Any:
    if SESSION_ID.fullmatch(session_id) is None:
        raise Rejection(400, "bad_id", "malformed session id: 1-128 of A-Z a-z 0-9 _ . : -")
    settings = sidecar.settings
    try:
        verified_by_any(
            settings.secrets, verify_events_token, _token(request), settings.agent, session_id
        )
    except SignatureError as error:
        raise Rejection(401, "bad_token", str(error)) from None
    after = request.headers.get("last-event-id") or request.query_params.get("after")
    return StreamingResponse(
        _stream(sidecar, session_id, Cursor.parse(after)),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )
