"""`<agent>-watchers/all`: the sessions clients stream, whose live events the workers send
(`live`).

A sidecar registers a session while a client streams it (`watch`; every 10 s it renews all the
sessions it streams in one call), for `WATCH_SECONDS`, by its tags (`webhooks.watch_tags`: an
HMAC of its id per webhook secret, two during a rotation), not by its id; a worker asks about the
tags of its sessions with live events (`watched`), and learns nothing of the others. Both come
through the ingress, which the agent's own tools reach: a registration is signed with the
webhook secret (`webhooks.watch_request`), else a tool could push the real tags out of the set
with tags of its own and silence every client's stream; tags are checked and their number
capped.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import restate
from restate.exceptions import TerminalError
from restate.serde import BytesSerde

from ... import jsoncodec
from ...spec import restate_services
from ..webhooks import signed_by_any, watch_signature
from .untrusted import parsed

WATCHED_STATE = "watched"
WATCH_SECONDS = 30.0
"""How long a registration lasts (the sidecar renews it every 10 s while the client's stream is
open: `tether.programs.sidecar.watching.WATCH_RENEW_SECONDS`)."""
MAX_WATCHED = 10_000
"""Tags kept (the latest to expire) and asked about at most."""
TAGS_PER_WATCH = 1_000
"""Tags a `watch` registers at most: a sidecar renews all its streams' sessions in one call."""
FRESH_MS = 60_000
"""How far a registration's stamp may be from the object's clock (the sidecar's clock against
the index's: a skew past it refuses every registration, and the sidecar logs each refusal). A
replay within it only renews real tags; one later is refused."""
TAG = re.compile(r"[0-9a-f]{32}")
RAW = BytesSerde()
"""The set is encoded with orjson (`jsoncodec`), not the SDK's serde (the standard library's):
every question decodes all of it; at 10,000 tags a third of a question's CPU in the index
(`bench/watched_set.py`)."""


def watchers_object(agent: str, secrets: Sequence[bytes]) -> restate.VirtualObject:
    """`<agent>-watchers/all`: the tags of the sessions clients stream (`watch`, from the
    sidecars) until they expire, read by the workers (`watched`)."""
    obj = restate.VirtualObject(
        restate_services(agent).watchers,
        description=f"The {agent} agent's sessions that clients stream.",
    )

    @obj.handler()
    async def watch(ctx: restate.ObjectContext, request: dict[str, Any]) -> None:
        tags, stamp = _checked(secrets, request)
        now = await ctx.run_typed("now", _wall_ms)
        if abs(now - stamp) > FRESH_MS:
            raise TerminalError("the registration is stale: sign it again", status_code=401)
        kept = await _kept(ctx)
        watched = {tag: until for tag, until in kept.items() if until > now}
        until = now + round(WATCH_SECONDS * 1000)
        for tag in tags[:TAGS_PER_WATCH]:
            if isinstance(tag, str) and TAG.fullmatch(tag):
                watched[tag] = until
        if len(watched) > MAX_WATCHED:
            latest = sorted(watched.items(), key=lambda item: item[1])[-MAX_WATCHED:]
            watched = dict(latest)
        ctx.set(WATCHED_STATE, jsoncodec.dumps(watched), serde=RAW)

    @obj.handler(kind="shared")
    async def watched(ctx: restate.ObjectSharedContext, tags: list[str]) -> dict[str, float]:
        """Those of `tags` registered, with when each expires (epoch ms: the reader compares).
        Only those asked: who cannot make a session's tag learns nothing of it."""
        kept = await _kept(ctx)
        asked = tags[:MAX_WATCHED] if isinstance(tags, list) else []
        return {tag: kept[tag] for tag in asked if isinstance(tag, str) and tag in kept}

    return obj


def _checked(secrets: Sequence[bytes], request: Any) -> tuple[list[Any], int]:
    """The tags and stamp of a registration that one of `secrets` signed."""

    def parse() -> tuple[Any, list[Any], int]:
        tags, stamp = request["tags"], request["stamp"]
        if not isinstance(tags, list) or type(stamp) is not int:
            raise TypeError("tags must be a list and the stamp an integer")
        return request["sig"], tags, stamp

    given, tags, stamp = parsed("a signed registration (`webhooks.watch_request`)", parse)
    if not signed_by_any(secrets, given, lambda s: watch_signature(s, tags, stamp)):
        raise TerminalError("not signed by a sidecar of this agent", status_code=401)
    return tags, stamp


async def _kept(ctx: restate.ObjectContext | restate.ObjectSharedContext) -> dict[str, float]:
    data = await ctx.get(WATCHED_STATE, serde=RAW)
    return jsoncodec.loads(data) if data else {}


async def _wall_ms() -> int:
    return time.time_ns() // 1_000_000
