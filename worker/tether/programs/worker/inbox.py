"""The inbox of a session on Restate: messages for a running agent (`tether.agent.inbox`).

A running session holds its agent object's lock (the exclusive `run` handler), so messages go
to a second virtual object, `<agent>-inbox`, keyed by the same session id: `post` appends a
message to its state, `take` hands over and clears what is there. The run takes at turn
boundaries (`tether.agent.inbox`); Restate journals the call and its answer, so a replay gets
the same messages and a message is taken once.

A call is an invocation of the inbox object, which costs the worker about as much as a turn of
the run. So a run calls `take` at its first boundary only, and after that only once something
was posted: each take leaves a doorbell in the inbox (an awakeable of the run), which the next
`post` rings, and the run looks at it first (`look`, inside a model step the loop journals
anyway, so a replay takes where the run took).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import restate
from restate.exceptions import TerminalError

from ...durable.protocol import DurableRuntime
from ...spec import restate_services
from .retries import RETRY_AFTER_WORKER_LOSS

MESSAGES_STATE_KEY = "messages"
DOORBELL_STATE_KEY = "doorbell"
MAX_MESSAGE_CHARS = 20_000
MAX_WAITING = 100
"""Messages an inbox holds until its session's run takes them: more are refused (429), as
anything that reaches the ingress may post."""
POST_IDEMPOTENCY_RETENTION = timedelta(days=1)
"""How long Restate keeps the idempotency key of a post: the sidecar posts a signed message
under a key derived from its signature, so a replay (accepted for 10 minutes around its
timestamp) finds the key and is not delivered twice."""


class RestateInbox:
    """The `Inbox` of the session the run handler's context is keyed by."""

    def __init__(self, ctx: restate.ObjectContext, take: Any) -> None:
        self._ctx = ctx
        self._take = take
        self._doorbell: Any = None
        """The awakeable the inbox resolves at the next post, once a take has left it there."""

    def look(self) -> bool | None:
        # No doorbell before the first take: the inbox may hold what came before the run.
        return None if self._doorbell is None else bool(self._doorbell.is_completed())

    async def take(self, durable: DurableRuntime, where: str) -> list[str]:
        doorbell_id, self._doorbell = self._ctx.awakeable()
        messages: list[str] = await self._ctx.object_call(
            self._take, key=self._ctx.key(), arg={"doorbell": doorbell_id}
        )
        return messages


def inbox_object(agent: str) -> tuple[restate.VirtualObject, Any]:
    """The inbox object of `agent`, and its `take` handler (for `RestateInbox`)."""
    obj = restate.VirtualObject(
        restate_services(agent).inbox,
        description=f"Messages for the {agent} agent's running sessions (key: session id).",
        invocation_retry_policy=RETRY_AFTER_WORKER_LOSS,
    )

    @obj.handler(idempotency_retention=POST_IDEMPOTENCY_RETENTION)
    async def post(ctx: restate.ObjectContext, message: dict[str, Any]) -> dict[str, int]:
        """Leave `{"text": "..."}` for the session's agent; it reads it at its next turn."""
        text = message.get("text") if isinstance(message, dict) else None
        if not isinstance(text, str) or not text.strip() or len(text) > MAX_MESSAGE_CHARS:
            raise TerminalError(
                f'expected {{"text": "<1-{MAX_MESSAGE_CHARS} characters>"}}', status_code=400
            )
        if not _encodable(text):  # a lone surrogate: the run that takes it could not store it
            raise TerminalError("the text is not valid Unicode", status_code=400)
        messages: list[str] = await ctx.get(MESSAGES_STATE_KEY) or []
        if len(messages) >= MAX_WAITING:
            raise TerminalError(
                f"the session's inbox holds {MAX_WAITING} messages no run has taken yet",
                status_code=429,
            )
        messages.append(text)
        ctx.set(MESSAGES_STATE_KEY, messages)
        doorbell: str | None = await ctx.get(DOORBELL_STATE_KEY)
        if doorbell:  # a run is waiting to hear of it (its invocation may have ended: harmless)
            ctx.resolve_awakeable(doorbell, True)
            ctx.clear(DOORBELL_STATE_KEY)
        return {"waiting": len(messages)}

    # Only runs take (a call through Restate): through the ingress, anything that reaches it
    # could take a session's messages, or leave an awakeable id of its choosing as the doorbell
    # for the next post to resolve.
    @obj.handler(ingress_private=True)
    async def take(ctx: restate.ObjectContext, request: dict[str, Any] | None) -> list[str]:
        """Everything posted since the last take (and nothing again); `{"doorbell": id}`: the
        awakeable the next post resolves."""
        messages: list[str] = await ctx.get(MESSAGES_STATE_KEY) or []
        if messages:
            ctx.clear(MESSAGES_STATE_KEY)
        doorbell = (request or {}).get("doorbell")
        if isinstance(doorbell, str):
            ctx.set(DOORBELL_STATE_KEY, doorbell)
        return messages

    return obj, take


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
