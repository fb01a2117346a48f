"""An aiohttp session that can start over on new connections, for the sidecar's and the
operator's calls to Restate.

Behind a Kubernetes Service each pooled connection stays with the pod it reached. When that pod
is gone without closing it (its node lost, or force-deleted), a request sent on it gets no answer
at all, and the other idle connections may lead to the same pod. So once a call fails, `renew()`
sends the next calls on new connections, which the Service gives to a ready pod; calls in flight
on the old ones finish or time out before those are closed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

NO_ANSWER = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)
"""The call got no answer: its connection failed (refused, reset, closed or cut short before the
whole answer, not made within the connect timeout), or nothing came back in time."""


class RenewableSession:
    def __init__(self, make: Callable[[], aiohttp.ClientSession], grace: float) -> None:
        """`make` opens a session (in the running event loop); `grace`: the longest a call may
        take (the session's total timeout), after which a retired session is closed."""
        self._make = make
        self._grace = grace
        self._session: aiohttp.ClientSession | None = None
        self._retired: list[tuple[float, aiohttp.ClientSession]] = []

    def get(self) -> aiohttp.ClientSession:
        # Opened on first use: a session belongs to the running event loop.
        if self._session is None or self._session.closed:
            self._session = self._make()
        return self._session

    async def fetch(
        self, method: str, url: str, **options: Any
    ) -> tuple[int, CIMultiDictProxy[str], bytes]:
        """`method url` (with aiohttp's request `options`): the answer's status, headers and
        body. When it gets no answer (`NO_ANSWER`, raised), the next calls go on new
        connections."""
        try:
            async with self.get().request(method, url, **options) as response:
                return response.status, response.headers, await response.read()
        except NO_ANSWER:
            await self.renew()
            raise

    async def renew(self) -> None:
        """Send the next calls on new connections."""
        now = time.monotonic()
        due = [session for retired_at, session in self._retired if now - retired_at > self._grace]
        self._retired = [entry for entry in self._retired if entry[1] not in due]
        for session in due:
            await session.close()
        if self._session is not None:
            self._retired.append((now, self._session))
            self._session = None

    async def close(self) -> None:
        for _, session in self._retired:
            await session.close()
        self._retired = []
        if self._session is not None:
            await self._session.close()
