"""`<agent>-pace/<provider>/<model>`: the slots of a model's calls across all the agent's
workers and versions, for a model with a `rateLimit` (`tether.providers.pace`).

A call asks here for its slot (`admit`) before it is sent, from inside its model step, so through
the ingress, and waits for it there. Each ask is signed with the webhook secret, which a tool in
the worker's pod never has, and names its rate, so versions of other rates share one model's
slots. Served with the index (`served`); a worker's end is `pace_client`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import restate
from restate.exceptions import TerminalError

from ...rate import Pace, Rate
from ...spec import restate_services
from ..webhooks import pace_signature, signed_by_any
from .untrusted import parsed

SLOTS_STATE = "slots"
FRESH_SECONDS = 60
"""How far an ask's stamp may be from the object's clock: an ask seen again later is refused."""


def pace_object(agent: str, secrets: Sequence[bytes]) -> restate.VirtualObject:
    """`<agent>-pace`, keyed by a model (`provider/name`): `admit` takes the next slots of a
    call and says how many milliseconds to wait for them."""
    obj = restate.VirtualObject(
        restate_services(agent).pace,
        description=f"The pace of the {agent} agent's calls of each model with a rate limit.",
    )

    @obj.handler()
    async def admit(ctx: restate.ObjectContext, ask: dict[str, Any]) -> float:
        pace, tokens, stamp = _checked(secrets, ctx.key(), ask)
        now = await ctx.time()
        if abs(now - stamp) > FRESH_SECONDS:
            raise TerminalError("the ask is stale: sign it again", status_code=401)
        last: dict[str, float] = await ctx.get(SLOTS_STATE) or {}
        wait_ms, slots = pace.next_slots(last, now * 1000, tokens)
        ctx.set(SLOTS_STATE, {**last, **slots})
        return wait_ms

    return obj


def pace_ask(pace: Pace, tokens: int, stamp: float) -> dict[str, Any]:
    """What a worker asks for a call's slots (`pace_signature` signs it)."""
    requests, input_tokens = pace.requests, pace.input_tokens
    return {
        "perMinute": requests.per_minute if requests else None,
        "burst": requests.burst if requests else None,
        "tokensPerMinute": input_tokens.per_minute if input_tokens else None,
        "tokens": tokens,
        "stamp": stamp,
    }


def _checked(secrets: Sequence[bytes], model: str, ask: Any) -> tuple[Pace, int, float]:
    """The pace, input tokens and stamp of an ask that one of `secrets` signed."""

    def parse() -> tuple[Any, Pace, int, float]:
        per_minute, tokens_per_minute = ask["perMinute"], ask["tokensPerMinute"]
        pace = Pace(
            requests=None if per_minute is None else Rate(per_minute, ask["burst"]),
            input_tokens=None if tokens_per_minute is None else Rate(tokens_per_minute),
        )
        return ask["sig"], pace, int(ask["tokens"]), float(ask["stamp"])

    given, pace, tokens, stamp = parsed("a signed ask for a slot (`pace_ask`)", parse)
    if not signed_by_any(secrets, given, lambda s: pace_signature(s, model, ask)):
        raise TerminalError("not signed by a worker of this agent", status_code=401)
    return pace, tokens, stamp
