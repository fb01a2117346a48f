"""A worker's end of the handoff of unsafe tool bodies' results between replicas
(`handoff`): it hands over the bodies of its attempts that ended, and asks for another
replica's."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx2

from ...restate.intents import NOT_HERE
from ...spec import restate_services
from ..metrics import TOOL_BODIES_HANDED_OVER
from ..webhooks import handoff_peek_signature, handoff_signature
from .ingress import IngressPoster

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
"""How often a process says that a body it handed over still runs."""
STALE_SECONDS = 20.0
"""Heartbeats missed this long: the process that ran the body is taken for gone."""
ANNOUNCE_SECONDS = 0.5
"""How long an attempt asks before it takes a body for not handed over: Restate starts the next
attempt 20 ms after a cut (`retries`), as the process that ran the body sends its first word."""
POST_FOR_SECONDS = 60.0
"""How long a result is offered while Restate does not answer (a node lost: the ingress of
another answers, or this one comes back)."""
POLL_SECONDS = (0.05, 1.0)
"""The first and the longest pause between two questions of a waiting attempt."""


class RestateHandoff:
    """A worker's `tether.restate.intents.Handoff` over `<agent>-handoff`, through Restate's
    ingress (a cluster's nodes in turn). Best effort: a post that fails is retried for
    `POST_FOR_SECONDS`; a question Restate does not answer counts as the sender's silence."""

    def __init__(self, agent: str, ingress_url: str, secret: bytes, timeout: float = 5.0) -> None:
        self.agent = agent
        self.ingress = IngressPoster(ingress_url, timeout)
        self.secret = secret
        self._path = f"/{restate_services(agent).handoff}"
        self._offering: dict[tuple[str, str], asyncio.Task[None]] = {}
        """The bodies handed over whose result is not yet (strong references to the tasks)."""

    def hand_over(self, nonce: str, bodies: Mapping[str, asyncio.Task[Any]]) -> None:
        for name, body in bodies.items():
            key = (nonce, name)
            if key in self._offering:  # a later attempt here that ended too: offered already
                continue
            offer = asyncio.get_running_loop().create_task(self._offer(nonce, name, body))
            self._offering[key] = offer
            offer.add_done_callback(functools.partial(self._offered, key))

    def _offered(self, key: tuple[str, str], _: asyncio.Task[None]) -> None:
        del self._offering[key]

    async def _offer(self, nonce: str, name: str, body: asyncio.Task[Any]) -> None:
        beat = 0  # numbered: a heartbeat sent again (by anyone) does not count twice
        while not body.done():
            beat += 1
            await self._put(nonce, name, {"done": False, "beat": beat})
            await asyncio.wait([body], timeout=HEARTBEAT_SECONDS)
        if body.cancelled() or body.exception() is not None:
            return  # no result to hand over: the other end reports the body interrupted
        await self._put(nonce, name, {"done": True, "result": body.result()})
        TOOL_BODIES_HANDED_OVER.labels(self.agent, "sent").inc()

    async def _put(self, nonce: str, name: str, note: dict[str, Any]) -> None:
        signed = {"call": name, **note}
        signed["sig"] = handoff_signature(self.secret, nonce, name, signed)
        deadline = time.monotonic() + POST_FOR_SECONDS
        while True:
            response = await self._send(f"{quote(nonce, safe='')}/put", signed)
            if response is not None and response.status_code < 500:
                if response.status_code >= 300:
                    log.warning(
                        "handing a tool result over: Restate answered %s", response.status_code
                    )
                return
            if time.monotonic() > deadline:
                log.warning("a tool result could not be handed over: Restate did not answer")
                return
            await asyncio.sleep(1.0)

    async def result(self, nonce: str, name: str) -> Any:
        ask = {"call": name, "sig": handoff_peek_signature(self.secret, nonce, name)}
        beats: Any = None  # the heartbeats counted when last heard
        asked = heard = time.monotonic()
        pause = POLL_SECONDS[0]
        while True:
            response = await self._send(f"{quote(nonce, safe='')}/peek", ask)
            if response is not None and response.status_code < 500:  # else: silence
                entry = _json(response)
                if not isinstance(entry, dict):  # nothing handed over (or a refusal)
                    if time.monotonic() - asked >= ANNOUNCE_SECONDS:
                        return NOT_HERE
                    await asyncio.sleep(POLL_SECONDS[0])
                    continue
                if entry.get("done"):
                    TOOL_BODIES_HANDED_OVER.labels(self.agent, "received").inc()
                    return entry.get("result")
                if entry.get("beats") != beats:
                    beats, heard = entry.get("beats"), time.monotonic()
            if time.monotonic() - heard > STALE_SECONDS:
                TOOL_BODIES_HANDED_OVER.labels(self.agent, "stale").inc()
                return NOT_HERE
            await asyncio.sleep(pause)
            pause = min(pause * 1.5, POLL_SECONDS[1])

    async def _send(self, path: str, body: Any) -> httpx2.Response | None:
        return await self.ingress.post(f"{self._path}/{path}", body, "a tool result handover")


def _json(response: httpx2.Response | None) -> Any:
    """A 200 answer's JSON value (None for none: Restate answers a handler's None with no body)."""
    if response is None or response.status_code != 200 or not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return None
