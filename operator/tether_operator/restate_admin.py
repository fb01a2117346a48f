"""Restate's admin API, as the operator uses it: register and unregister versions, list
deployments, resume paused invocations, and SQL introspection for pinned invocations and parked
calls. The calls and what their answers mean are `tether.programs.restate_admin`'s, shared with
`RestateServer`; this is their asynchronous transport, and what the operator asks of them
(cached counts). The admin API is one URL or a cluster's nodes' (comma-separated): a call whose
connection fails, or that gets no answer in time, goes to the next on a new connection
(`tether.programs.restate_endpoints`, `tether.programs.renewable_session`)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from tether.errors import TetherError
from tether.parked import PARKED_STATE_KEY
from tether.programs import restate_admin as admin
from tether.programs.renewable_session import NO_ANSWER, RenewableSession
from tether.programs.restate_admin import AdminCall, AdminRefused, parse_body, retry_delay
from tether.programs.restate_endpoints import Endpoints
from tether.spec import SPEND_KEY

from .lease import Guard

T = TypeVar("T")

IN_FLIGHT_SQL = (
    "SELECT pinned_deployment_id AS id, target_service_name AS service, status, COUNT(*) AS n "
    "FROM sys_invocation WHERE status != 'completed' "
    "GROUP BY pinned_deployment_id, target_service_name, status"
)
"""Every unfinished invocation, counted by the deployment it is pinned to (none: not started on
any, e.g. inboxed or scheduled), its service and its status: the drain, the scaler and the
gauges of every agent read this one query."""
PAUSED_SQL = "SELECT id FROM sys_invocation WHERE status = 'paused' AND pinned_deployment_id = '{}'"
PINNED_SQL = (
    "SELECT id FROM sys_invocation WHERE status != 'completed' AND pinned_deployment_id = '{}'"
)
SCHEDULED_SQL = (
    "SELECT id FROM sys_invocation WHERE status = 'scheduled' AND target_service_name = '{}'"
)
UNPINNED_PAUSED_SQL = (
    "SELECT id FROM sys_invocation WHERE status = 'paused' AND pinned_deployment_id IS NULL "
    "AND target_service_name IN ({})"
)
SERVICE_NAME = re.compile(r"^[a-z0-9][-a-z0-9]*$")
NOT_STARTED_YET = frozenset({"scheduled", "pending", "inboxed"})
"""Statuses of an unpinned invocation that needs no worker yet: due later, or queued behind
another invocation of its key (which is pinned, and counted there; `sys_invocation` calls it
`pending`, `sys_invocation_status` `inboxed`)."""
DEPLOYMENT_ID = re.compile(r"^dp_[A-Za-z0-9]+$")
CANCEL_GRACE = 300.0
"""Seconds a run cancelled at drain.timeout has to clean up and end before it is killed (its
version may be at zero replicas: woken, a pod has to start first)."""
WAITING_STATUSES = frozenset({"suspended", "paused"})
"""Statuses of an invocation that waits without a worker: for a person, a timer or another call
(suspended), or for someone to resume it (paused)."""
PARKED_SQL = (
    f"SELECT service_name AS service, value_utf8 AS value FROM state "
    f"WHERE key = '{PARKED_STATE_KEY}'"
)

SCHEDULES_SQL = (
    "SELECT service_name AS service, service_key AS name, value_utf8 AS value FROM state "
    "WHERE key = 'schedule' AND service_name LIKE '%-schedule'"
)
"""Every agent's schedules as their objects keep them (`tether.programs.worker.schedule`)."""
SPEND_SQL = (
    "SELECT service_name AS service, service_key AS name, value_utf8 AS value FROM state "
    "WHERE key = 'windows' AND service_name LIKE '%-spend'"
)
"""What every agent's runs spent, by period (`tether.programs.worker.spend`)."""


class RestateError(TetherError):
    """Restate could not be reached, or refused; `reason` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RestateApi:
    """One of Restate's HTTP APIs (the admin API or the ingress), at one URL or a cluster's
    nodes', to which `AdminCall`s are sent with aiohttp."""

    name = "Restate's API"

    def __init__(self, base_url: str, timeout: float, guard: Guard | None = None) -> None:
        self._guard = guard
        """Asked before each change to Restate (`lease.Lease.check`): it raises to refuse it."""
        self.endpoints = Endpoints(base_url)
        self.base_url = str(self.endpoints)
        # A node that is gone (its machine, not only its process) is given up on quickly.
        limits = aiohttp.ClientTimeout(total=timeout, sock_connect=min(timeout, 3.0))
        self._session = RenewableSession(
            lambda: aiohttp.ClientSession(trust_env=False, timeout=limits), grace=timeout
        )

    async def close(self) -> None:
        await self._session.close()

    async def send(self, call: AdminCall[T], *, changes: bool = False) -> T:
        """`call`'s value; a busy Restate is asked twice more, and anything else that goes
        wrong is a `RestateError` whose reason the DurableAgent's conditions show. A call that
        `changes` Restate is the guard's to refuse first."""
        if changes and self._guard is not None:
            self._guard(f"{call.method} {call.path}")

        async def send(base: str) -> tuple[int, float | None, Any]:
            status, headers, raw = await self._session.fetch(
                call.method,
                f"{base}{call.path}",
                json=call.payload,
                headers={"accept": "application/json"},
            )
            return status, retry_delay(status, headers, 0.5), parse_body(raw)

        for attempt in range(3):
            try:
                status, wait, body = await self.endpoints.call(send, NO_ANSWER)
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                raise RestateError(
                    "RestateUnreachable",
                    f"{self.name} at {self.base_url} did not answer "
                    f"{call.method} {call.path}: {error or type(error).__name__}",
                ) from None
            if wait is not None and attempt < 2:
                await asyncio.sleep(wait)
                continue
            try:
                return call.answer(status, body)
            except AdminRefused as refused:
                raise RestateError(refused.failure, f"Restate refused: {refused}") from None
        raise AssertionError("unreachable")  # pragma: no cover


class RestateIngress(RestateApi):
    """Restate's ingress: the handlers the operator calls (a schedule's `set`)."""

    name = "Restate's ingress"


class RestateAdmin(RestateApi):
    """The admin calls of `tether.programs.restate_admin`."""

    name = "Restate's admin API"

    async def register(self, uri: str, metadata: dict[str, str]) -> str:
        """Register (or re-discover, for a rollback) the version at `uri`; its deployment id."""
        return await self.send(admin.register(uri, metadata=metadata), changes=True)

    async def unregister(self, deployment_id: str) -> None:
        await self.send(admin.unregister(deployment_id), changes=True)

    async def deployments(self) -> list[dict[str, Any]]:
        return await self.send(admin.deployments())

    async def query(self, sql: str) -> list[dict[str, Any]]:
        return await self.send(admin.query(sql))

    async def resume_paused(self, deployment_id: str, services: Sequence[str] = ()) -> int:
        """Resume the paused invocations pinned to `deployment_id` (on it), and those of
        `services` pinned to none (on their latest deployment); how many."""
        if not DEPLOYMENT_ID.match(deployment_id):
            raise RestateError("QueryFailed", f"not a Restate deployment id: {deployment_id!r}")
        if not all(SERVICE_NAME.match(name) for name in services):
            raise RestateError("QueryFailed", f"not Restate service names: {services!r}")
        rows = await self.query(PAUSED_SQL.format(deployment_id))
        if services:
            names = ", ".join(f"'{name}'" for name in services)
            rows += await self.query(UNPINNED_PAUSED_SQL.format(names))
        return await self._each(rows, admin.resume)

    async def end_pinned(self, deployment_id: str, *, kill: bool = False) -> int:
        """Cancel (or kill) the invocations pinned to `deployment_id`; how many. Before it is
        removed with runs still pinned (drain.timeout): no other deployment can take them over,
        and one left would hold its session's lock for good, every later run of the session
        queued behind it. A cancelled run cleans up (its parked calls leave the indexes); one
        that does not end after `CANCEL_GRACE` is killed."""
        if not DEPLOYMENT_ID.match(deployment_id):
            raise RestateError("QueryFailed", f"not a Restate deployment id: {deployment_id!r}")
        rows = await self.query(PINNED_SQL.format(deployment_id))
        return await self._each(rows, admin.kill if kill else admin.cancel)

    async def kill_scheduled(self, service: str) -> int:
        """Kill the invocations of `service` that wait for their time (delayed sends); how
        many."""
        if not SERVICE_NAME.match(service):
            raise RestateError("QueryFailed", f"not a Restate service name: {service!r}")
        return await self._each(await self.query(SCHEDULED_SQL.format(service)), admin.kill)

    async def _each(
        self, rows: list[dict[str, Any]], command: Callable[[str], AdminCall[None]]
    ) -> int:
        """Send `command` for the invocation of each row; how many."""
        for row in rows:
            await self.send(command(str(row["id"])), changes=True)
        return len(rows)


@dataclass
class _Cached:
    value: Any = None
    at: float = float("-inf")
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True)
class Runs:
    """The unfinished invocations pinned to one deployment, by what they wait for."""

    active: int = 0
    """Running, ready or backing off: they need a worker now (or as soon as one answers). An
    unknown status counts here too, so nothing is taken for idle that Restate did not say
    waits."""
    suspended: int = 0
    paused: int = 0

    @property
    def parked(self) -> int:
        """Runs that wait without a worker."""
        return self.suspended + self.paused

    def __add__(self, other: Runs) -> Runs:
        return Runs(
            self.active + other.active,
            self.suspended + other.suspended,
            self.paused + other.paused,
        )


@dataclass(frozen=True)
class InFlight:
    """Invocations not completed yet: pinned to a deployment, or not started on any."""

    pinned: dict[str, int]
    unpinned: dict[str, int]
    statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    """The pinned ones by deployment, then by status."""
    unpinned_statuses: dict[str, dict[str, int]] = field(default_factory=dict)
    """The unpinned ones by service, then by status."""

    def runs(self, deployment_id: str | None) -> Runs:
        """The invocations pinned to `deployment_id`."""
        return _runs(self.statuses.get(deployment_id or "", {}))

    def starting(self, services: Iterable[str]) -> Runs:
        """The invocations of `services` pinned to no deployment yet, which want one now: new
        runs (and their messages, answers and reads) that Restate sends to the services'
        latest deployment, and those it paused there (e.g. while it had no pods)."""
        counts: Counter[str] = Counter()
        for service in services:
            for status, n in self.unpinned_statuses.get(service, {}).items():
                if status not in NOT_STARTED_YET:
                    counts[status] += n
        return _runs(counts)


def _runs(counts: Mapping[str, int]) -> Runs:
    waiting = {s: n for s, n in counts.items() if s in WAITING_STATUSES}
    return Runs(
        active=sum(counts.values()) - sum(waiting.values()),
        suspended=waiting.get("suspended", 0),
        paused=waiting.get("paused", 0),
    )


class RestateObserver:
    """Answers shared by every agent, each asked at most once per `max_age` seconds, so fifty
    agents polling at once cost Restate one query."""

    def __init__(self, admin: RestateAdmin, in_flight_age: float, parked_age: float) -> None:
        self.admin = admin
        self._ages = {
            "in_flight": in_flight_age,
            "parked": parked_age,
            "schedules": parked_age,
            "spend": parked_age,
        }
        self._cache: dict[str, _Cached] = {name: _Cached() for name in self._ages}

    async def _cached(self, name: str, load: Callable[[], Awaitable[Any]], max_age: float) -> Any:
        entry = self._cache[name]
        async with entry.lock:
            if time.monotonic() - entry.at > max_age:
                entry.value = await load()
                entry.at = time.monotonic()
            return entry.value

    async def _load_in_flight(self) -> InFlight:
        pinned: Counter[str] = Counter()
        unpinned: Counter[str] = Counter()
        statuses: dict[str, Counter[str]] = {}
        unpinned_statuses: dict[str, Counter[str]] = {}
        for row in await self.admin.query(IN_FLIGHT_SQL):
            n = int(row["n"])
            if row.get("id") is None:
                unpinned[row["service"]] += n
                unpinned_statuses.setdefault(row["service"], Counter())[str(row["status"])] += n
                continue
            pinned[row["id"]] += n
            statuses.setdefault(row["id"], Counter())[str(row["status"])] += n
        return InFlight(
            pinned=dict(pinned),
            unpinned=dict(unpinned),
            statuses={d: dict(counts) for d, counts in statuses.items()},
            unpinned_statuses={s: dict(counts) for s, counts in unpinned_statuses.items()},
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
            except (ValueError, RecursionError):  # edited by hand: nested past the parser
                continue
            counts[row["service"]] += len(parked) if isinstance(parked, dict) else 0
        return counts

    async def parked_calls(self, service: str) -> int:
        counts: Counter[str] = await self._cached("parked", self._load_parked, self._ages["parked"])
        return counts[service]

    async def _load_state(self, sql: str) -> dict[str, dict[str, dict[str, Any]]]:
        """The JSON objects of `sql`'s rows (service, name, value), by service and key."""
        found: dict[str, dict[str, dict[str, Any]]] = {}
        for row in await self.admin.query(sql):
            try:
                kept = json.loads(row["value"] or "null")
            except (ValueError, RecursionError):  # edited by hand: nested past the parser
                continue
            if isinstance(kept, dict):
                found.setdefault(row["service"], {})[str(row["name"])] = kept
        return found

    async def _state(self, name: str, sql: str, service: str) -> dict[str, dict[str, Any]]:
        found = await self._cached(name, lambda: self._load_state(sql), self._ages[name])
        return dict(found.get(service, {}))

    async def schedules(self, service: str) -> dict[str, dict[str, Any]]:
        """The schedules `service` keeps, by name."""
        return await self._state("schedules", SCHEDULES_SQL, service)

    async def spend(self, service: str) -> dict[str, Any]:
        """What the agent of `<agent>-spend` (`service`) spent, by period."""
        return (await self._state("spend", SPEND_SQL, service)).get(SPEND_KEY, {})
