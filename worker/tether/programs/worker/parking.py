"""Parking a tool call on an awakeable until a person answers: approvals and `ask_human`.

The park is recorded in the object's state (`tether:parked`, read by the sidecar and the
`pending` handler), announced once through a journaled notification step, and raced against a
durable timer when it has a deadline. The invocation suspends while it waits: no worker holds it.
The announcement is the signed JSON of the record with approve/deny links
(`approvals.notify.format: json`), or a Slack message with Approve and Deny buttons (`slack`,
`tether.programs.slack`). Its end (answer, timeout or rejection) is a journaled step, so the
attempt that gets the answer is known to be live; for an answer it keeps who decided, how and
when, as the resolution says (`approved`, `by`, `approver`, `decided_at`: the sidecar adds them),
the run's record of the decision next to the value Restate keeps for the awakeable. The attempt
whose `park:end` runs live also observes how long the call was parked
(`tether_parked_duration_seconds`): once per park, whichever way the answer came (the sidecar,
Restate's API, the timer), and never again when a later attempt replays that step.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx2
import restate
from restate.exceptions import TerminalError

from ...messages import JSON
from ...parked import PARKED_STATE_KEY, ParkedCall, ParkedKind, summarize
from ...restate.awakeable import race_with_timeout
from ...restate.errors import is_restate_cancellation
from ...restate.runtime import default_run_options
from ...restate.types import AwakeableOutcome, AwakeableWithTimeoutOptions
from ...session.events import event
from ...spec import NotifyFormat
from ...tools.base import ToolContext
from ...tools.human import Answer, Wait, decision_of
from ..metrics import observe_parked, parked_seconds
from ..redact import redact
from ..slack.messages import approval_message
from ..webhooks import LinkAction, sign_request, signed_link
from .parked_index import ParkedIndex

log = logging.getLogger("tether.programs.worker")


@dataclass(frozen=True)
class ParkSettings:
    agent: str
    timeout_seconds: float | None
    notify_url: str | None
    """A credential (a Slack incoming webhook's path is its token): log `host_of(url)` only."""
    webhook_secret: bytes | None
    webhook_base_url: str | None
    recipients: tuple[str, ...] = ()
    """`approvals.notify.recipients`: each gets links of their own."""
    index: ParkedIndex | None = None
    """The agent's index of parked calls (what its sidecars read), kept in step with the map."""
    notify_format: NotifyFormat = "json"
    """`approvals.notify.format`: the signed JSON of the record, or a Slack message."""


def host_of(url: str) -> str:
    """The host (and port) of `url`, which is all of it a log line may name."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port}" if parts.port else host


def _signed_json(settings: ParkSettings, record: ParkedCall) -> tuple[bytes, dict[str, str]]:
    """The body and headers of `format: json`: the record with its links, signed."""
    payload: dict[str, Any] = dict(record)
    expires = int(record.get("expires_at", record["created_at"] + 86_400_000) / 1000)
    if settings.webhook_secret and settings.webhook_base_url:
        secret, base = settings.webhook_secret, settings.webhook_base_url

        def links(recipient: str | None) -> dict[str, str]:
            actions: tuple[LinkAction, ...] = ("approve", "deny")
            return {
                f"{action}_url": signed_link(
                    base, secret, action, record["awakeable_id"], expires, recipient=recipient
                )
                for action in actions
            }

        payload.update(links(None))
        if settings.recipients:  # one pair per person: a decision names who made it
            payload["recipients"] = [{"to": who, **links(who)} for who in settings.recipients]
    body = json.dumps(payload).encode()
    # Delivery is at least once (a crash mid-step re-sends); receivers dedupe by this key.
    headers = {"content-type": "application/json", "idempotency-key": record["awakeable_id"]}
    if settings.webhook_secret:
        path = urlsplit(settings.notify_url or "").path or "/"
        headers.update(sign_request(settings.webhook_secret, body, path=path))
    return body, headers


def _slack_message(
    settings: ParkSettings, record: ParkedCall, arguments: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of `format: slack`: a Block Kit message for the incoming webhook
    (which takes no signature: its URL is its credential). Slack keeps no idempotency key: a
    crash mid-step posts the message twice, and either's buttons answer the call once."""
    message = approval_message(record, arguments, settings.webhook_secret)
    return json.dumps(message).encode(), {"content-type": "application/json"}


async def _notify(
    settings: ParkSettings, record: ParkedCall, arguments: dict[str, Any]
) -> dict[str, Any]:
    """POST the parked call to `notify_url` in its format; never fails the run."""
    if settings.notify_format == "slack":
        body, headers = _slack_message(settings, record, arguments)
    else:
        body, headers = _signed_json(settings, record)
    assert settings.notify_url is not None
    try:
        async with httpx2.AsyncClient(timeout=10) as client:
            response = await client.post(settings.notify_url, content=body, headers=headers)
    except httpx2.HTTPError as error:
        # The host only: the URL's path may be its token, and the error's text may hold the URL.
        reason = redact(str(error)) or "no detail"
        host = host_of(settings.notify_url)
        log.warning(
            "approval notification to %s failed: %s (%s)", host, type(error).__name__, reason
        )
        return {"delivered": False, "error": type(error).__name__}
    if not response.is_success:
        # Slack says why in a word (`invalid_blocks`, `no_service`); redacted all the same.
        why = redact(response.text[:100]) if settings.notify_format == "slack" else ""
        log.warning(
            "approval notification to %s answered HTTP %d%s",
            host_of(settings.notify_url),
            response.status_code,
            f" ({why})" if why else "",
        )
    return {"delivered": response.is_success, "status": response.status_code}


async def park(
    ctx: restate.ObjectContext,
    tool_ctx: ToolContext,
    settings: ParkSettings,
    *,
    kind: ParkedKind,
    arguments: dict[str, Any],
) -> AwakeableOutcome[Any]:
    """Park the call until the awakeable is resolved (or the deadline passes)."""
    future: Any
    awakeable_id, future = ctx.awakeable()
    created = await tool_ctx.durable.now()
    record: ParkedCall = {
        "awakeable_id": awakeable_id,
        "kind": kind,
        "agent": settings.agent,
        "session": ctx.key(),
        "tool": tool_ctx.tool_name,
        "call_id": tool_ctx.call_id,
        "input_summary": summarize(arguments),
        "created_at": created,
    }
    if settings.timeout_seconds:
        record["expires_at"] = created + settings.timeout_seconds * 1000
    parked: dict[str, ParkedCall] = await ctx.get(PARKED_STATE_KEY) or {}
    parked[awakeable_id] = record
    ctx.set(PARKED_STATE_KEY, parked)
    if settings.index is not None:
        settings.index.add(ctx, record)
    await _publish(
        tool_ctx,
        "approval_parked" if kind == "approval" else "question_parked",
        created,
        tool=record["tool"],
        call_id=record["call_id"],
        input=record["input_summary"],
        expires_at=record.get("expires_at"),
    )
    tool_ctx.durable.checkpoint()  # the session shows the parked call while it waits
    if settings.notify_url:

        async def notify() -> dict[str, Any]:
            return await _notify(settings, record, arguments)

        await ctx.run_typed(f"notify:{tool_ctx.call_id}", notify, default_run_options())
    timeout_ms = settings.timeout_seconds * 1000 if settings.timeout_seconds else None
    try:
        outcome = await race_with_timeout(
            ctx, future, AwakeableWithTimeoutOptions(timeout_ms=timeout_ms, promises=restate)
        )
    except TerminalError as error:  # rejected, or the invocation was cancelled
        await _unpark(ctx, settings, awakeable_id)
        if not is_restate_cancellation(error):
            await _ended(tool_ctx, settings, record, {"rejected": True})
        raise
    await _unpark(ctx, settings, awakeable_id)
    how = {"timed_out": outcome.timed_out, **decision_of(outcome.value)}
    await _ended(tool_ctx, settings, record, how)
    return outcome


async def _publish(tool_ctx: ToolContext, kind: str, at: float, **fields: Any) -> None:
    """A park's event in the session's stream (journaled values only, so a replay writes the
    same)."""
    log = tool_ctx.durable.stores.events
    if log is not None and tool_ctx.session_id:
        await log.append(tool_ctx.session_id, [event(kind, tool_ctx.run_id, at, **fields)])


def restate_wait(ctx: restate.ObjectContext, settings: ParkSettings) -> Wait:
    """The tools' `Wait` on Restate: `park` on an awakeable; a rejection becomes an answer, a
    cancellation of the invocation goes on up."""

    async def wait(tool_ctx: ToolContext, kind: ParkedKind, arguments: dict[str, Any]) -> Answer:
        try:
            outcome = await park(ctx, tool_ctx, settings, kind=kind, arguments=arguments)
        except TerminalError as error:
            if is_restate_cancellation(error):
                raise
            return Answer(rejected=error.message)
        return Answer(value=outcome.value, timed_out=outcome.timed_out)

    return wait


async def _ended(
    tool_ctx: ToolContext, settings: ParkSettings, parked: ParkedCall, how: dict[str, Any]
) -> None:
    """Journal the end of the park as a step of the call. It runs live in the attempt that
    first gets the answer (the run is live from there: `replay:done` fires, and the call's
    `tool:after` is counted) and is replayed by any attempt after. That attempt, and only it,
    observes how long the call was parked: once its step is journaled, so an attempt that dies
    before the step is in the journal leaves the observation to the one that runs it again."""
    ran = False

    async def record() -> JSON:
        nonlocal ran
        ran = True
        return how

    await tool_ctx.durable.step("decision", "park:end", record)
    resolved = "approval_resolved" if parked["kind"] == "approval" else "question_answered"
    at = how.get("decided_at") or parked["created_at"]
    await _publish(tool_ctx, resolved, at, tool=parked["tool"], call_id=parked["call_id"], **how)
    if ran:
        seconds = parked_seconds(parked, how, time.time() * 1000)
        observe_parked(settings.agent, parked["kind"], seconds)


async def _unpark(ctx: restate.ObjectContext, settings: ParkSettings, awakeable_id: str) -> None:
    parked: dict[str, ParkedCall] = await ctx.get(PARKED_STATE_KEY) or {}
    parked.pop(awakeable_id, None)
    ctx.set(PARKED_STATE_KEY, parked)
    if settings.index is not None:
        settings.index.remove(ctx, awakeable_id)
