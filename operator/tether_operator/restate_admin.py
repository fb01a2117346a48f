"""Restate's admin API, as the operator uses it: register and unregister versions, list
deployments, and SQL introspection for pinned invocations and parked calls. The calls and what
their answers mean are `tether.programs.restate_admin`'s, shared with `RestateServer`; this is
their asynchronous transport, and what the operator asks of them (cached counts)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from tether.errors import TetherError
from tether.parked import PARKED_STATE_KEY
from tether.programs import restate_admin as admin
from tether.programs.restate_admin import AdminCall, AdminRefused, parse_body, retry_delay

T = TypeVar("T")

PINNED_SQL = (
    "SELECT pinned_deployment_id AS id, COUNT(*) AS n FROM sys_invocation "
    "WHERE status != 'completed' AND pinned_deployment_id IS NOT NULL "
    "GROUP BY pinned_deployment_id"
)
UNPINNED_SQL = (
    "SELECT target_service_name AS service, COUNT(*) AS n FROM sys_invocation "
    "WHERE status != 'completed' AND pinned_deployment_id IS NULL "
    "GROUP BY target_service_name"
)
PARKED_SQL = (
    f"SELECT service_name AS service, value_utf8 AS value FROM state "
    f"WHERE key = '{PARKED_STATE_KEY}'"
)


class RestateError(TetherError):
    """Restate could not be reached, or refused; `reason` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RestateAdmin:
    """The admin calls of `tether.programs.restate_admin`, sent with aiohttp."""

    def __init__(self, base_url: str, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(trust_env=False, timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _send(self, call: AdminCall[T]) -> T:
        """`call`'s value; a busy Restate is asked twice more, and anything else that goes
        wrong is a `RestateError` whose reason the DurableAgent's conditions show."""
        url = f"{self.base_url}{call.path}"
        for attempt in range(3):
            try:
                async with self._client().request(
                    call.method, url, json=call.payload, headers={"accept": "application/json"}
                ) as response:
                    body = parse_body(await response.text())
                    wait = retry_delay(response.status, response.headers, 0.5)
                    if wait is not None and attempt < 2:
                        await asyncio.sleep(wait)
                        continue
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                raise RestateError(
                    "RestateUnreachable",
                    f"Restate's admin API at {self.base_url} did not answer "
                    f"{call.method} {call.path}: {error or type(error).__name__}",
                ) from None
            try:
                return call.answer(response.status, body)
            except AdminRefused as refused:
                raise RestateError(refused.failure, f"Restate refused: {refused}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def register(self, uri: str, metadata: dict[str, str]) -> str:
        """Register (or re-discover, for a rollback) the version at `uri`; its deployment id."""
        return await self._send(admin.register(uri, metadata=metadata))

    async def unregister(self, deployment_id: str) -> None:
        await self._send(admin.unregister(deployment_id))

    async def deployments(self) -> list[dict[str, Any]]:
        return await self._send(admin.deployments())

    async def query(self, sql: str) -> list[dict[str, Any]]:
        return await self._send(admin.query(sql))


@dataclass
class _Cached:
    value: Any = None
    at: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True)
class InFlight:
    """Invocations not completed yet: pinned to a deployment, or not started on any."""

    pinned: dict[str, int]
    unpinned: dict[str, int]


class RestateObserver:
    """Answers shared by every agent, each asked at most once per `max_age` seconds, so fifty
    agents polling at once cost Restate one query."""

    def __init__(self, admin: RestateAdmin, in_flight_age: float, parked_age: float) -> None:
        self.admin = admin
        self._ages = {"in_flight": in_flight_age, "parked": parked_age}
        self._cache: dict[str, _Cached] = {name: _Cached() for name in self._ages}

    async def _cached(self, name: str, load: Callable[[], Awaitable[Any]], max_age: float) -> Any:
        entry = self._cache[name]
        async with entry.lock:
            if time.monotonic() - entry.at > max_age:
                entry.value = await load()
                entry.at = time.monotonic()
            return entry.value

    async def _load_in_flight(self) -> InFlight:
        pinned = await self.admin.query(PINNED_SQL)
        unpinned = await self.admin.query(UNPINNED_SQL)
        return InFlight(
            pinned={row["id"]: int(row["n"]) for row in pinned},
            unpinned={row["service"]: int(row["n"]) for row in unpinned},
        )

    async def in_flight(self, max_age: float | None = None) -> InFlight:
        """Counts at most `max_age` seconds old (0: ask now)."""
        age = self._ages["in_flight"] if max_age is None else max_age
        value: InFlight = await self._cached("in_flight", self._load_in_flight, age)
        return value

    async def _load_parked(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for row in await self.admin.query(PARKED_SQL):
            try:
                parked = json.loads(row["value"] or "{}")
            except ValueError:
                continue
            counts[row["service"]] += len(parked) if isinstance(parked, dict) else 0
        return counts

    async def parked_calls(self, service: str) -> int:
        counts: Counter[str] = await self._cached("parked", self._load_parked, self._ages["parked"])
        return counts[service]
