"""The sessions this sidecar's clients stream, registered in `<agent>-watchers` so the workers
send their live events (`tether.programs.worker.live`).

A session is registered as soon as a stream of it opens, then renewed with every other session
this process streams, in one call every `WATCH_RENEW_SECONDS`: the registry is one key of one
exclusive handler, which takes some tens of calls a second, so a call per stream would not keep
up with a thousand open streams, and a call per process does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Sequence

from ..webhooks import watch_request, watch_tags
from .restate_client import RestateClient

WATCH_RENEW_SECONDS = 10.0
"""How often the open streams' sessions are registered again; a registration lasts 30 s
(`tether.programs.worker.watchers.WATCH_SECONDS`)."""
TAGS_PER_CALL = 1_000
"""Tags registered per call at most (`tether.programs.worker.watchers.TAGS_PER_WATCH`)."""


class Watching:
    """The sessions this process streams, with how many streams each."""

    def __init__(self, restate: RestateClient, agent: str, secrets: Sequence[bytes]) -> None:
        self.restate = restate
        self.agent = agent
        self.secrets = tuple(secrets)
        self._open: Counter[str] = Counter()
        self._renewing: asyncio.Task[None] | None = None

    def _tags(self, sessions: list[str]) -> list[str]:
        return [tag for session in sessions for tag in watch_tags(self.secrets, session)]

    async def _register(self, tags: list[str]) -> None:
        await self.restate.watch(self.agent, watch_request(self.secrets[0], tags))

    async def start(self, session: str) -> None:
        """A stream of `session` opens: registered before this returns (best effort). Counted
        only once registered: a stream gone meanwhile (its `stop` never comes) leaves nothing."""
        await self._register(self._tags([session]))
        self._open[session] += 1
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.get_running_loop().create_task(self._renew())

    def stop(self, session: str) -> None:
        """A stream of `session` closed; its registration lapses unless another is open."""
        self._open[session] -= 1
        if self._open[session] <= 0:
            del self._open[session]

    async def _renew(self) -> None:
        while self._open:
            await asyncio.sleep(WATCH_RENEW_SECONDS)
            tags = self._tags(list(self._open))
            for first in range(0, len(tags), TAGS_PER_CALL):
                await self._register(tags[first : first + TAGS_PER_CALL])

    async def close(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
