"""Unsafe tool bodies' results handed from one worker replica to another, through Restate.

A tool body behind an intent (`tether.restate.intents`) runs on after its attempt ends (a
Restate node lost, a partition's leader moved, a connection cut), and the next attempt of the
run journals its result instead of reporting it interrupted, when the same process serves that
attempt. With two replicas or more, the next attempt may land on the other one. So the process
whose attempt ended hands over the bodies it started, to `<agent>-handoff/<intent nonce>`:
"still running" at once and every 5 s (`handoff_client`), then the result. The other replica,
which finds the intent journaled and a body's result missing, asks there (`peek`) and waits
while the body is said to run. It reports the body interrupted, as before, when nothing was
handed over within half a second (the first process died, or had not yet noticed its attempt's
end) or when the heartbeats stop for 20 s. A body whose attempt ended before it started (while
the intent awaited its acknowledgement) is not handed over: only its own process may start it.

Both ends come through the ingress (the handed-over process has no invocation left, and the
asking one asks from inside the body's step), so every request is signed with the webhook
secret: only a worker hands a result over or reads one. A nonce's record goes `KEEP` after it
was made. The object is served with the index (`served`); a worker's end is `handoff_client`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import restate
from restate.exceptions import TerminalError

from ...spec import restate_services
from ..webhooks import handoff_peek_signature, handoff_signature, signed_by_any

CALLS_STATE = "calls"
KEEP = timedelta(days=1)
"""How long a nonce's record is kept after it was made (a body that runs longer is reported
interrupted to an attempt that asks after that)."""


def handoff_object(agent: str, secrets: Sequence[bytes]) -> restate.VirtualObject:
    """`<agent>-handoff`, keyed by an intent's nonce: `put` (a process hands a body over),
    `peek` (another asks for it), both signed with one of `secrets`."""
    obj = restate.VirtualObject(
        restate_services(agent).handoff,
        description=f"Tool results of the {agent} agent handed from one worker to another.",
    )

    @obj.handler(ingress_private=True)
    async def forget(ctx: restate.ObjectContext, _: None) -> None:
        ctx.clear_all()

    @obj.handler()
    async def put(ctx: restate.ObjectContext, note: dict[str, Any]) -> None:
        """`{"call": step name, "done": false, "beat": n}` (its n-th heartbeat: it runs) or
        `{..., "done": true, "result": the step's value}`, with `"sig"`. A heartbeat counts once
        (an older one, sent again, is ignored), and a result stays as first handed over."""
        call = _checked(secrets, note, lambda s, c: handoff_signature(s, ctx.key(), c, note))
        calls: dict[str, Any] = await ctx.get(CALLS_STATE) or {}
        entry = calls.get(call) or {"done": False, "beats": 0}
        beat = note.get("beat")
        if entry["done"]:
            return
        if note.get("done"):
            entry = {"done": True, "result": note.get("result")}
        elif isinstance(beat, int) and beat > entry["beats"]:
            entry = {"done": False, "beats": beat}
        else:
            return  # an older heartbeat, sent again
        if not calls:  # a new record: it goes once it has served
            ctx.object_send(forget, ctx.key(), None, send_delay=KEEP)
        calls[call] = entry
        ctx.set(CALLS_STATE, calls)

    @obj.handler(kind="shared")
    async def peek(ctx: restate.ObjectSharedContext, ask: dict[str, Any]) -> dict[str, Any] | None:
        """What was handed over of `{"call": step name, "sig": ...}`: `{"done": true, "result":
        ...}`, `{"done": false, "beats": n}`, or null."""
        call = _checked(secrets, ask, lambda s, c: handoff_peek_signature(s, ctx.key(), c))
        calls: dict[str, Any] = await ctx.get(CALLS_STATE) or {}
        return calls.get(call)

    return obj


def _checked(secrets: Sequence[bytes], request: Any, signature: Callable[[bytes, str], str]) -> str:
    """The call a request names, once one of `secrets` signed it (`signature(secret, call)`)."""
    call = request.get("call") if isinstance(request, dict) else None
    given = request.get("sig") if isinstance(request, dict) else None
    if not isinstance(call, str) or not isinstance(given, str) or not secrets:
        raise TerminalError("expected a signed {call, sig}", status_code=400)
    if not signed_by_any(secrets, given, lambda s: signature(s, call)):
        raise TerminalError("not signed by a worker of this agent", status_code=401)
    return call
