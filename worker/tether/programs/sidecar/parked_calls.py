"""The parked calls of the agent, read from Restate (never from the sidecar's memory).

The worker keeps the agent's index of parked calls (`tether.programs.worker.parked_index`); this
reads it through the ingress with a listing token signed with the webhook secret, and reuses a read
for a short while. A lookup that misses re-reads once, so a call parked a moment ago is found.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

from ...parked import ParkedCall
from ..webhooks import listing_token
from .rejection import Rejection
from .restate_client import RestateClient

log = logging.getLogger("tether.programs.sidecar")


def by_awakeable(records: list[dict[str, object]]) -> dict[str, ParkedCall]:
    """The records by awakeable id; one without an id is skipped."""
    return {
        str(record["awakeable_id"]): cast(ParkedCall, record)
        for record in records
        if isinstance(record.get("awakeable_id"), str)
    }


class ParkedCalls:
    """Cached reads of the parked-call records of one agent."""

    def __init__(
        self,
        restate: RestateClient,
        agent: str,
        secret: bytes,
        *,
        max_age: float = 2.0,
        min_refresh_interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._restate = restate
        self._agent = agent
        self._secret = secret
        self._max_age = max_age
        self._min_refresh_interval = min_refresh_interval
        self._clock = clock
        self._records: dict[str, ParkedCall] | None = None
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    async def _read(self, max_age: float, *, stale_ok: bool = True) -> dict[str, ParkedCall]:
        async with self._lock:  # one read at a time; waiters reuse its result
            if self._records is not None and self._clock() - self._read_at <= max_age:
                return self._records
            try:
                token = listing_token(self._secret)
                records = by_awakeable(await self._restate.parked_calls(self._agent, token))
            except Rejection:
                if self._records is None or not stale_ok:
                    raise
                log.warning("reading the parked calls failed; using a read from before")
                return self._records
            self._records, self._read_at = records, self._clock()
            return records

    async def all(self) -> dict[str, ParkedCall]:
        return await self._read(self._max_age)

    async def find(self, awakeable_id: str) -> ParkedCall | None:
        """The record of `awakeable_id`, re-reading once if a cached read misses it."""
        record = (await self.all()).get(awakeable_id)
        if record is None:  # a miss is only an answer if the read is fresh
            record = (await self._read(self._min_refresh_interval, stale_ok=False)).get(
                awakeable_id
            )
        return record

    async def matching(self, match: Callable[[ParkedCall], bool]) -> list[ParkedCall]:
        """The records `match` accepts (a call found by its name, not its id), re-reading once
        if a cached read has none."""
        found = [record for record in (await self.all()).values() if match(record)]
        if not found:
            fresh = await self._read(self._min_refresh_interval, stale_ok=False)
            found = [record for record in fresh.values() if match(record)]
        return found

    def forget(self, awakeable_id: str) -> None:
        """Drop a record that was just resolved (the worker removes it from state soon)."""
        if self._records is not None:
            self._records.pop(awakeable_id, None)

    async def require(self, awakeable_id: str) -> ParkedCall:
        record = await self.find(awakeable_id)
        if record is None:
            raise Rejection(404, "unknown_id", "no call of this agent is parked on this id")
        return record
