"""The live part of a session's event stream: model text as it streams, tool calls started.

They are never journaled (a step's body cannot write to the journal while it runs), so the
worker sends them, batched, through Restate's ingress to the virtual object `<agent>-live` keyed
by the session, where every sidecar replica reads them. A batch is signed with the webhook
secret: only the worker adds to a session's stream. The object keeps the last batches, and
numbers each event after the durable event it follows (`"<durable>.<n>"`). A model call (or
tool call) that starts a second time was cut off by a crash: the object puts a
`model_restarted` (`tool_restarted`) event before it, so a client drops the partial text.

Only for the sessions someone watches: each batch is an invocation of `<agent>-live`, up to 20
a second per streaming session, which for runs nobody watched cost several times the runs
themselves. A sidecar registers each session a client streams in `<agent>-watchers/all`
(`watchers`), by a tag of the session, for 30 s, renewed while the stream is open. A worker
asks which of its sessions with live events are in that set, each question about all of them:
at once (at most every `ASK_EVERY_SECONDS`) when a session it has not asked about lately has
events, so a watched session's go as soon as the answer says so; and, at most every
`RECHECK_SECONDS`, once events have waited `LATE_WATCHER_SECONDS`: an unwatched session's are
dropped unless a client came meanwhile (one that opens its stream as it starts a run sees them
all). A question reads the whole set: a worker whose runs stream for long asks about twice a
second, not for every session's batches (`bench/watched_set.py`).
Without an answer (a read that fails, an index too old to serve the set, a worker without a
webhook secret), the worker sends every session's, as it did before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import restate

from ...messages import JSON
from ...session.events import Cursor
from ...spec import WATCHERS_KEY, restate_services
from ..webhooks import live_signature, live_signed, watch_tags
from .ingress import IngressPoster
from .untrusted import parsed

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
ASK_EVERY_SECONDS = 0.1
"""The least time between two questions of a worker to the watched set (each an invocation)."""
RECHECK_SECONDS = 0.5
"""The least time between two questions about sessions asked about before (their events wait up
to `LATE_WATCHER_SECONDS` and this long before they are dropped)."""
RENEW_SECONDS = 10.0
"""A watched session with events is asked about again after this long (its registration, renewed
every 10 s while watched, lasts 30 s from each renewal)."""
LATE_WATCHER_SECONDS = 1.0
"""How long a session's live events wait for a client to start watching: one that opens its
stream just after it started a run still sees the run's first live events."""
UNREAD_SECONDS = 30.0
"""How long a worker sends every session's live events after the watched set failed to answer
(an index too old to serve it, Restate restarting), before it asks again."""
MAX_WAITING = 1_000
"""Live events a session keeps until they are sent or dropped."""


def live_object(
    agent: str, secrets: tuple[bytes, ...], keep: int = KEEP_BATCHES
) -> restate.VirtualObject:
    """`<agent>-live`: `push` (the worker's signed batches) and `read` (for the sidecars); the
    last `keep` batches of a session are kept (`spec.events.liveBatches`)."""
    obj = restate.VirtualObject(
        restate_services(agent).live,
        description=f"The live events of the {agent} agent's sessions.",
    )

    @obj.handler()
    async def push(ctx: restate.ObjectContext, batch: dict[str, Any]) -> None:
        events = batch.get("events") if isinstance(batch, dict) else None
        if not isinstance(events, list):
            return
        sig = str(batch.get("sig") or "")
        if secrets and not parsed(
            "a signed batch of live events", lambda: live_signed(secrets, ctx.key(), events, sig)
        ):
            log.warning("a live batch for a session was not signed by the worker: dropped")
            return
        meta: dict[str, Any] = await ctx.get(META_KEY) or {"count": 0, "batch": 0, "started": []}
        started: list[str] = meta["started"]
        numbered: list[JSON] = []
        for item in events:
            after, event = parsed("a batch of live events", functools.partial(_item, item))
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


_tags_of = functools.lru_cache(maxsize=4096)(watch_tags)
"""`watch_tags`, asked at every flush for each session with events: the HMACs once a session."""


class LivePublisher:
    """The worker's `LiveSink`: queues live events and posts them, batched per session, to
    `<agent>-live/<session>/push/send` through the ingress (a cluster's nodes in turn, when the
    connection to one cannot be made: `tether.programs.restate_endpoints`; a post that may have
    arrived is not sent twice), for the sessions clients watch (the module's doc). Best effort:
    a failed post is dropped and logged, and the posts after it go on new connections (the
    pooled ones may lead to a lost node's pod, which answers nothing:
    `tether.programs.renewable_session`). `watch_secrets`: the webhook secrets, the current one
    first, whose tags of a session a sidecar may have registered (none: every session's events
    are sent)."""

    def __init__(
        self,
        agent: str,
        ingress_url: str,
        secret: bytes | None,
        timeout: float = 5.0,
        watch_secrets: Sequence[bytes] = (),
    ) -> None:
        self.agent = agent
        self.ingress = IngressPoster(ingress_url, timeout) if ingress_url else None
        self.secret = secret
        self.watch_secrets = tuple(watch_secrets)
        self._pending: dict[str, list[JSON]] = {}
        self._since: dict[str, float] = {}
        """When each session's oldest pending event came (monotonic)."""
        self._unasked = not self.watch_secrets or self.ingress is None
        """No set to ask (no secret to make tags with, no ingress): every session's events go."""
        self._unread_until = float("-inf")
        """Until when every session's events go, the set having failed to answer (monotonic)."""
        self._watched: dict[str, tuple[float, float]] = {}
        """The tags known to be watched: when each registration expires (epoch ms) and when
        the question was asked that said so (monotonic)."""
        self._answered_at = float("-inf")
        """When the question of that answer was asked (monotonic)."""
        self._asked_at = float("-inf")
        self._asked_about: dict[str, float] = {}
        """When each session was last asked about (monotonic), for `RENEW_SECONDS`."""
        self._asking: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None

    def __call__(self, session: str, after: int, event: JSON) -> None:
        pending = self._pending.get(session)
        if pending is None:
            pending = self._pending[session] = []
            self._since[session] = time.monotonic()
        if len(pending) < MAX_WAITING:
            pending.append({"after": after, "event": event})
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(FLUSH_SECONDS)
        while self._pending:
            now, wall_ms = time.monotonic(), time.time() * 1000
            everyone = self._unasked or now < self._unread_until
            ready: dict[str, list[JSON]] = {}
            undecided: list[str] = []
            renew: list[str] = []
            for session in list(self._pending):
                watched = None if everyone else self._watched_since(session, wall_ms)
                if everyone or watched is not None:
                    ready[session] = self._pending.pop(session)
                    if watched is not None and now - watched > RENEW_SECONDS:
                        renew.append(session)  # asked again before the registration it knows ends
                elif self._answered_at >= self._since[session] + LATE_WATCHER_SECONDS:
                    del self._pending[session]  # nobody came to watch them
                else:
                    undecided.append(session)
                    continue
                del self._since[session]
            if undecided or renew:
                self._ask_if_due(undecided, renew)
            if ready:  # posted at once; what comes meanwhile goes next, with no wait
                await asyncio.gather(*(self._post(s, events) for s, events in ready.items()))
            elif self._asking is not None and not self._asking.done():
                await asyncio.wait([self._asking], timeout=FLUSH_SECONDS)  # decide on its answer
            else:
                await asyncio.sleep(FLUSH_SECONDS)

    def _watched_since(self, session: str, wall_ms: float) -> float | None:
        """When the question was asked that said `session` is watched (a registration that
        lasts past `wall_ms`, epoch ms); None: not known to be."""
        for tag in _tags_of(self.watch_secrets, session):
            until, asked = self._watched.get(tag, (0.0, 0.0))
            if until > wall_ms:
                return asked
        return None

    def _ask_if_due(self, undecided: list[str], renew: list[str]) -> None:
        """Ask whether `undecided` sessions are watched, at most every `ASK_EVERY_SECONDS`: when
        one of them was not asked about lately (a client may watch it: its first events go as
        soon as the answer says so), or when a watched session's answer is old (`renew`); and at
        most every `RECHECK_SECONDS` when events have waited `LATE_WATCHER_SECONDS` since the
        last question (sent if a client came meanwhile, else dropped)."""
        now = time.monotonic()
        asked = self._asked_at
        if now - asked < ASK_EVERY_SECONDS or (self._asking and not self._asking.done()):
            return
        known = self._asked_about
        new = any(now - known.get(session, -math.inf) >= RENEW_SECONDS for session in undecided)
        late = now - asked >= RECHECK_SECONDS and any(
            asked < self._since[session] + LATE_WATCHER_SECONDS <= now for session in undecided
        )
        if not (new or late or renew):
            return
        sessions = undecided + renew
        self._asked_about = {s: t for s, t in known.items() if now - t < RENEW_SECONDS}
        self._asked_about.update(dict.fromkeys(sessions, now))
        self._asked_at = now
        self._asking = asyncio.get_running_loop().create_task(self._ask(sessions, now))

    async def _ask(self, sessions: list[str], asked: float) -> None:
        tags = [tag for session in sessions for tag in _tags_of(self.watch_secrets, session)]
        path = f"/{restate_services(self.agent).watchers}/{WATCHERS_KEY}/watched"
        assert self.ingress is not None  # else every session's events go, unasked
        try:
            response = await self.ingress.post(path, tags, "the watched sessions")
            answer = response.json() if response and response.status_code == 200 else None
        except Exception:  # no answer is an answer too: the events must not wait for ever
            log.exception("asking for the watched sessions failed")
            answer = None
        if not isinstance(answer, dict):
            # asked again in `UNREAD_SECONDS`: logged at most that often
            log.warning("the watched sessions could not be read: sending every session's")
            self._unread_until = time.monotonic() + UNREAD_SECONDS
            return
        # what was asked is as answered; a session not asked about keeps what it had
        now = time.time() * 1000
        watched = {tag: known for tag, known in self._watched.items() if known[0] > now}
        for tag in tags:
            until = answer.get(tag)
            if isinstance(until, int | float) and until > now:
                watched[tag] = (until, asked)
            else:
                watched.pop(tag, None)
        self._watched = watched
        self._answered_at = asked

    async def _post(self, session: str, events: list[JSON]) -> None:
        if self.ingress is None:
            return
        body: dict[str, Any] = {"events": events}
        if self.secret:
            body["sig"] = live_signature(self.secret, session, events)
        path = f"/{restate_services(self.agent).live}/{quote(session, safe='')}/push/send"
        response = await self.ingress.post(path, body, "live events dropped")
        if response is not None and response.status_code >= 300:
            log.warning("live events: Restate answered HTTP %s", response.status_code)

    async def close(self) -> None:
        if self._asking is not None:
            with contextlib.suppress(Exception):
                await self._asking
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if self.ingress is not None:
            await self.ingress.close()


def _item(item: Any) -> tuple[int, dict[str, Any]]:
    return int(item["after"]), dict(item["event"])
