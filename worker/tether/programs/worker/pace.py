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

from ...rate import Rate
from ...spec import restate_services
from ..webhooks import pace_signature, signatures_equal

LAST_SLOT_STATE = "last"
FRESH_SECONDS = 60
"""How far an ask's stamp may be from the object's clock: an ask seen again later is refused."""


def pace_object(agent: str, secrets: Sequence[bytes]) -> restate.VirtualObject:
    """`<agent>-pace`, keyed by a model (`provider/name`): `admit` takes its next slot and
    says how many milliseconds to wait for it."""
    obj = restate.VirtualObject(
        restate_services(agent).pace,
        description=f"The pace of the {agent} agent's calls of each model with a rate limit.",
    )

    @obj.handler()
    async def admit(ctx: restate.ObjectContext, ask: dict[str, Any]) -> float:
        rate, stamp = _checked(secrets, ctx.key(), ask)
        now = await ctx.time()
        if abs(now - stamp) > FRESH_SECONDS:
            raise TerminalError("the ask is stale: sign it again", status_code=401)
        wait_ms, slot = rate.next_slot(await ctx.get(LAST_SLOT_STATE) or 0.0, now * 1000)
        ctx.set(LAST_SLOT_STATE, slot)
        return wait_ms

    return obj


def _checked(secrets: Sequence[bytes], model: str, ask: Any) -> tuple[Rate, float]:
    """The rate and stamp of an ask that one of `secrets` signed."""
    try:
        given = ask["sig"]
        rate = Rate(ask["perMinute"], ask["burst"])
        stamp = float(ask["stamp"])
    except (KeyError, TypeError, ValueError):
        raise TerminalError("expected a signed {perMinute, burst, stamp, sig}", 400) from None
    if not isinstance(given, str) or not any(
        signatures_equal(pace_signature(s, model, ask), given) for s in secrets
    ):
        raise TerminalError("not signed by a worker of this agent", status_code=401)
    return rate, stamp
