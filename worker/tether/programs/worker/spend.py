"""`<agent>-spend/all`: what all of an agent's runs spend in each calendar hour, day and month,
held to the caps of its spec (`limits.spendCaps`, `tether.spend_caps`).

A model call holds its worst case here (`reserve`) before it is sent and settles what it spent
(`settle`) once it returns, from inside its model step, so through the ingress. Each request is
signed with the webhook secret, which a tool in the worker's pod never has, and names its caps,
so versions of other caps share one count. The windows follow Restate's clock, not a worker's.
Served with the index (`served`); a worker's end is `spend_client`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import restate
from restate.exceptions import TerminalError

from ...budget import Spend
from ...spec import restate_services
from ...spend_caps import SpendCap, SpendWindows
from ..webhooks import signed_by_any, spend_signature
from .pace import FRESH_SECONDS
from .untrusted import parsed

STATE_KEY = "windows"


def spend_object(agent: str, secrets: Sequence[bytes]) -> restate.VirtualObject:
    """`<agent>-spend`: `reserve` holds a call's worst case if it fits the caps it names,
    `settle` counts what it spent, `describe` shows the current windows."""
    obj = restate.VirtualObject(
        restate_services(agent).spend,
        description=f"What the {agent} agent's runs spend together, held to its spend caps.",
    )

    async def checked(ctx: restate.ObjectContext, request: Any, op: str) -> tuple[_Asked, float]:
        asked, now = _checked(secrets, request, op), await ctx.time()
        if abs(now - asked.stamp) > FRESH_SECONDS:
            raise TerminalError("the request is stale: sign it again", status_code=401)
        return asked, now

    @obj.handler()
    async def reserve(ctx: restate.ObjectContext, request: dict[str, Any]) -> dict[str, Any]:
        asked, now = await checked(ctx, request, "reserve")
        windows = SpendWindows.of(await ctx.get(STATE_KEY))
        refusal = windows.reserve(asked.caps, asked.hold, asked.amount, now, asked.model)
        ctx.set(STATE_KEY, windows.to_json())
        return {"granted": True} if refusal is None else {"refusal": refusal.to_json()}

    @obj.handler()
    async def settle(ctx: restate.ObjectContext, request: dict[str, Any]) -> None:
        asked, now = await checked(ctx, request, "settle")
        windows = SpendWindows.of(await ctx.get(STATE_KEY))
        windows.settle(asked.hold, asked.amount, now)
        ctx.set(STATE_KEY, windows.to_json())

    @obj.handler(kind="shared")
    async def describe(ctx: restate.ObjectSharedContext) -> dict[str, Any]:
        """What was spent in the current hour, day and month, and what calls in flight hold."""
        windows = SpendWindows.of(await ctx.get(STATE_KEY))
        return {"windows": windows.windows(await ctx.time())}

    return obj


def spend_request(
    op: str, hold: str, amount: Spend, caps: Sequence[SpendCap], stamp: float, model: str = ""
) -> dict[str, Any]:
    """What a worker sends to hold (`reserve`) or settle a call's spend (`spend_signature`
    signs it); a hold names the call's model (`provider/name`), which its model's caps count."""
    request = {
        "op": op,
        "hold": hold,
        "amount": amount.to_json(),
        "caps": [cap.to_json() for cap in caps],
        "stamp": stamp,
    }
    return {**request, "model": model} if model else request


class _Asked(NamedTuple):
    caps: list[SpendCap]
    hold: str
    amount: Spend
    stamp: float
    model: str


def _checked(secrets: Sequence[bytes], request: Any, op: str) -> _Asked:
    """What a request for `op` that one of `secrets` signed asks."""
    what = f"a signed request to {op} (`spend_request`)"

    def parse() -> tuple[Any, _Asked]:
        hold, model = request["hold"], request.get("model") or ""
        if request["op"] != op or not isinstance(hold, str) or not 0 < len(hold) <= 64:
            raise ValueError("another op, or no hold")
        if not isinstance(model, str):
            raise TypeError("a model is a name")
        caps = [SpendCap.of(cap) for cap in request["caps"]]
        amount, stamp = Spend.of(request["amount"]), float(request["stamp"])
        return request["sig"], _Asked(caps, hold, amount, stamp, model)

    given, asked = parsed(what, parse)
    if not signed_by_any(secrets, given, lambda s: spend_signature(s, request)):
        raise TerminalError("not signed by a worker of this agent", status_code=401)
    return asked
