"""The live part of a session's event stream: model text as it streams, tool calls started.

They are never journaled (a step's body cannot write to the journal while it runs), so the
worker sends them, batched, through Restate's ingress to the virtual object `<agent>-live` keyed
by the session, where every sidecar replica reads them. A batch is signed with the webhook
secret: only the worker adds to a session's stream. The object keeps the last batches, and
numbers each event after the durable event it follows (`"<durable>.<n>"`). A model call (or
tool call) that starts a second time was cut off by a crash: the object puts a
`model_restarted` (`tool_restarted`) event before it, so a client drops the partial text.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from typing import Any
from urllib.parse import quote

import httpx2
import restate

from ...messages import JSON
from ...session.events import Cursor
from ..restate_endpoints import Endpoints
from ..webhooks import live_signature, live_signed

log = logging.getLogger(__name__)

META_KEY = "live"
KEEP_BATCHES = 50
"""Batches kept per session (a client that reconnects mid-call gets the text so far)."""
KEEP_STARTED = 200
FLUSH_SECONDS = 0.05
"""How long a live event may wait to share a request with the next ones."""
RESTARTS = {
    "model_started": ("call", "model_restarted"),
    "tool_started": ("call_id", "tool_restarted"),
}


def live_object(
    agent: str, secrets: tuple[bytes, ...], keep: int = KEEP_BATCHES
) -> restate.VirtualObject:
    """`<agent>-live`: `push` (the worker's signed batches) and `read` (for the sidecars); the
    last `keep` batches of a session are kept (`spec.events.liveBatches`)."""
    obj = restate.VirtualObject(
        f"{agent}-live", description=f"The live events of the {agent} agent's sessions."
    )

    @obj.handler()
    async def push(ctx: restate.ObjectContext, batch: dict[str, Any]) -> None:
        events = batch.get("events")
        if not isinstance(events, list):
            return
        if secrets and not live_signed(secrets, ctx.key(), events, str(batch.get("sig") or "")):
            log.warning("a live batch for a session was not signed by the worker: dropped")
            return
        meta: dict[str, Any] = await ctx.get(META_KEY) or {"count": 0, "batch": 0, "started": []}
        started: list[str] = meta["started"]
        numbered: list[JSON] = []
        for item in events:
            after, event = int(item["after"]), dict(item["event"])
            kind = RESTARTS.get(str(event.get("type")))
            if kind is not None:
                key = f"{event.get('run')}/{event.get(kind[0])}"
                if key in started:  # the same call started again: a crash cut it off
                    numbered.append(_number(meta, after, {**event, "type": kind[1]}))
                else:
                    started.append(key)
            numbered.append(_number(meta, after, event))
        del started[:-KEEP_STARTED]
        meta["batch"] += 1
        ctx.set(f"live:{meta['batch']}", numbered)
        if meta["batch"] > keep:
            ctx.clear(f"live:{meta['batch'] - keep}")
        ctx.set(META_KEY, meta)

    @obj.handler(kind="shared")
    async def read(ctx: restate.ObjectSharedContext, after: str | None) -> list[JSON]:
        """The live events kept that a reader at the cursor `after` has not had."""
        cursor = Cursor.parse(after)
        meta: dict[str, Any] | None = await ctx.get(META_KEY)
        if meta is None:
            return []
        found: list[JSON] = []
        for number in range(meta["batch"], max(0, meta["batch"] - keep), -1):
            batch: list[JSON] = await ctx.get(f"live:{number}") or []
            newer = [e for e in batch if not cursor.has(e)]
            found[:0] = newer
            if len(newer) < len(batch):  # older batches hold nothing newer
                break
        return found

    return obj


def _number(meta: dict[str, Any], after: int, event: JSON) -> JSON:
    meta["count"] += 1
    return {**event, "id": str(Cursor(after, meta["count"]))}


class LivePublisher:
    """The worker's `LiveSink`: queues live events and posts them, batched per session, to
    `<agent>-live/<session>/push/send` through the ingress (a cluster's nodes in turn, when the
    connection to one cannot be made: `tether.programs.restate_endpoints`; a post that may have
    arrived is not sent twice). Best effort: a failed post is dropped and logged, and the posts
    after it go on new connections (the pooled ones may lead to a lost node's pod, which
    answers nothing: `tether.programs.renewable_session`)."""

    def __init__(
        self, agent: str, ingress_url: str, secret: bytes | None, timeout: float = 5.0
    ) -> None:
        self.agent = agent
        self.ingress = Endpoints(ingress_url) if ingress_url else None
        self.secret = secret
        self.timeout = timeout
        self._pending: dict[str, list[JSON]] = defaultdict(list)
        self._task: asyncio.Task[None] | None = None
        self._client: httpx2.AsyncClient | None = None
        self._retired: httpx2.AsyncClient | None = None

    def __call__(self, session: str, after: int, event: JSON) -> None:
        self._pending[session].append({"after": after, "event": event})
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(FLUSH_SECONDS)
        while self._pending:
            pending, self._pending = self._pending, defaultdict(list)
            await asyncio.gather(*(self._post(s, events) for s, events in pending.items()))

    async def _post(self, session: str, events: list[JSON]) -> None:
        body: dict[str, Any] = {"events": events}
        if self.secret:
            body["sig"] = live_signature(self.secret, session, events)
        if self.ingress is None:
            return
        if self._client is None:
            self._client = httpx2.AsyncClient(timeout=self.timeout, trust_env=False)
        client = self._client
        path = f"/{self.agent}-live/{quote(session, safe='')}/push/send"
        try:
            response = await self.ingress.call(
                lambda base: client.post(f"{base}{path}", json=body),
                (httpx2.ConnectError, httpx2.ConnectTimeout),
            )
            if response.status_code >= 300:
                log.warning("live events: Restate answered HTTP %s", response.status_code)
        except httpx2.HTTPError as error:
            log.warning("live events dropped: %s", type(error).__name__)
            await self._renew(client)

    async def _renew(self, client: httpx2.AsyncClient) -> None:
        """New connections from now on; the client retired before `client` is closed (a post
        still on it is dropped, as a failed one is)."""
        if self._client is client:
            retired, self._retired, self._client = self._retired, client, None
            if retired is not None:
                await retired.aclose()

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        for client in (self._retired, self._client):
            if client is not None:
                await client.aclose()
