"""Awakeables with a durable deadline."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .types import (
    AwakeableOutcome,
    AwakeableWithTimeoutOptions,
    RestateAwakeable,
    RestateContextLike,
)


async def race_with_timeout(
    ctx: RestateContextLike,
    promise: Any,
    options: AwakeableWithTimeoutOptions | None = None,
) -> AwakeableOutcome[Any]:
    """Race an already-minted awakeable future against a durable `ctx.sleep(timeout_ms)`.

    Split from `awakeable_with_timeout` so a caller that journals steps between minting and
    parking arms the race only when it parks. Without a positive `timeout_ms` no timer is
    armed; with one, `options.promises` (the SDK's `select`) is required."""
    options = options or AwakeableWithTimeoutOptions()
    if not options.timeout_ms or options.timeout_ms <= 0:
        return AwakeableOutcome(timed_out=False, value=await promise)
    if options.promises is None:
        raise ValueError("a timeout needs `promises` (pass the restate module) for a durable race")
    timer = ctx.sleep(timedelta(milliseconds=options.timeout_ms))
    winner, value = await options.promises.select(value=promise, timeout=timer)
    if winner == "timeout":
        return AwakeableOutcome(timed_out=True)
    return AwakeableOutcome(timed_out=False, value=value)


def awakeable_with_timeout(
    ctx: RestateContextLike, options: AwakeableWithTimeoutOptions | None = None
) -> RestateAwakeable[AwakeableOutcome[Any]]:
    """Mint an awakeable whose promise resolves to `AwakeableOutcome(timed_out=False, value)`
    with the resumer's payload, or `AwakeableOutcome(timed_out=True)` when `timeout_ms` elapses
    first. The id is journal-stable; the deadline is a durable sleep, so a parked invocation
    suspends instead of holding a worker. A rejection raises `TerminalError` when awaited."""
    awakeable_id, future = ctx.awakeable()
    return RestateAwakeable(id=awakeable_id, promise=race_with_timeout(ctx, future, options))
