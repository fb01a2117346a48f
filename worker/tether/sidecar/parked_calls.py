"""The parked calls of the agent, read from Restate (never from the sidecar's memory).

The worker keeps `{awakeable id: ParkedCall}` per session under the `tether:parked` state key of
the agent object; this reads all sessions' maps through the admin API's SQL `state` table
(columns `service_name`, `service_key`, `key`, `value_utf8`, ...) and reuses a read for a short
while. A lookup that misses re-reads once, so a call parked a moment ago is found.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from ..parked import PARKED_STATE_KEY, ParkedCall
from .rejection import Rejection
from .restate_client import RestateClient

log = logging.getLogger("tether.sidecar")


def parked_calls_query(agent: str) -> str:
    def quoted(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    return (
        "SELECT service_key, value_utf8 FROM state "
        f"WHERE service_name = {quoted(agent)} AND key = {quoted(PARKED_STATE_KEY)}"
    )


def parse_rows(rows: list[dict[str, Any]]) -> dict[str, ParkedCall]:
    """The records of all sessions by awakeable id; unreadable rows are logged and skipped."""
    parked: dict[str, ParkedCall] = {}
    for row in rows:
        try:
            records = json.loads(row["value_utf8"] or "{}")
            if not isinstance(records, dict):
                raise ValueError("not a JSON object")
        except (KeyError, TypeError, ValueError) as error:
            log.warning(
                "skipping unreadable %s of %r: %s", PARKED_STATE_KEY, row.get("service_key"), error
            )
            continue
        for awakeable_id, record in records.items():
            if (
                isinstance(record, dict)
                and record.get("awakeable_id", awakeable_id) == awakeable_id
            ):
                parked[awakeable_id] = cast(ParkedCall, {"awakeable_id": awakeable_id, **record})
    return parked


class ParkedCalls:
    """Cached reads of the parked-call records of one agent."""

    def __init__(
        self,
        restate: RestateClient,
        agent: str,
        *,
        max_age: float = 2.0,
        min_refresh_interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._restate = restate
        self._query = parked_calls_query(agent)
        self._max_age = max_age
        self._min_refresh_interval = min_refresh_interval
        self._clock = clock
        self._records: dict[str, ParkedCall] | None = None
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    async def _read(self, max_age: float) -> dict[str, ParkedCall]:
        async with self._lock:  # one query at a time; waiters reuse its result
            if self._records is not None and self._clock() - self._read_at <= max_age:
                return self._records
            try:
                records = parse_rows(await self._restate.query(self._query))
            except Rejection:
                if self._records is None:
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
        if record is None:
            record = (await self._read(self._min_refresh_interval)).get(awakeable_id)
        return record

    def forget(self, awakeable_id: str) -> None:
        """Drop a record that was just resolved (the worker removes it from state soon)."""
        if self._records is not None:
            self._records.pop(awakeable_id, None)

    async def require(self, awakeable_id: str) -> ParkedCall:
        record = await self.find(awakeable_id)
        if record is None:
            raise Rejection(404, "unknown_id", "no call of this agent is parked on this id")
        return record
