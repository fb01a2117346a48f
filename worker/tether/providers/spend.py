"""A model's calls held to the agent's spend caps (`tether.spend_caps`): each call holds its worst
case before it is sent and settles what it spent once it returns, so all of an agent's runs
together never pass a cap."""

from __future__ import annotations

import random
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from .. import jsoncodec
from .._sqlite import Database
from ..budget import Spend, usage_tokens, worst_case
from ..spend_caps import Refusal, SpendCap, SpendWindows
from .base import ModelRequest, ModelResponse, Pricing, ProviderError

T = TypeVar("T")


WAKE_SPREAD_SECONDS = 30.0
"""Runs that wait for a spend cap's period to reset wake within this long after it, at random,
so that they do not all ask at once."""


class SpendCapReached(ProviderError):
    """A call that does not fit one of the agent's spend caps: it does not start, and its run
    ends with `budget_exceeded`, or, when the cap waits, retries once the period has reset."""

    def __init__(self, refusal: Refusal, provider: str) -> None:
        wait = refusal.wait_seconds + random.uniform(0, WAKE_SPREAD_SECONDS)
        super().__init__(
            refusal.message(),
            provider=provider,
            code="spend_cap",
            retryable=refusal.waits,
            retry_after=wait if refusal.waits else None,
        )
        self.refusal = refusal


class SpendGate(Protocol):
    """Where an agent's calls hold their spend against its caps."""

    @property
    def caps(self) -> Sequence[SpendCap]: ...

    async def reserve(self, hold: str, ask: Spend, model: str) -> Refusal | None:
        """Hold `ask` for the call `hold` to `model` (`provider/name`); the cap it would pass
        instead."""
        ...

    async def settle(self, hold: str, actual: Spend) -> None:
        """The call `hold` is done and spent `actual`."""
        ...


class LocalSpendGate:
    """The caps kept by this process alone (a worker without Restate's ingress, a library's
    agent): the calls of other processes are not counted."""

    def __init__(self, caps: Sequence[SpendCap], clock: Callable[[], float] = time.time) -> None:
        self.caps = tuple(caps)
        self.windows = SpendWindows()
        self._clock = clock

    async def reserve(self, hold: str, ask: Spend, model: str) -> Refusal | None:
        return self.windows.reserve(self.caps, hold, ask, self._clock(), model)

    async def settle(self, hold: str, actual: Spend) -> None:
        self.windows.settle(hold, actual, self._clock())


class SqliteSpendGate:
    """The caps kept in an embedded runtime's SQLite file (`tether run`): every process that
    runs the agent `agent` on the file counts with the others, and a new one goes on from what
    they spent. The file is opened at the first call."""

    def __init__(
        self,
        path: str | Path,
        agent: str,
        caps: Sequence[SpendCap],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.caps = tuple(caps)
        self.path, self.agent = path, agent
        self._clock = clock
        self._db: Database | None = None

    async def reserve(self, hold: str, ask: Spend, model: str) -> Refusal | None:
        return self._changed(
            lambda windows: windows.reserve(self.caps, hold, ask, self._clock(), model)
        )

    async def settle(self, hold: str, actual: Spend) -> None:
        self._changed(lambda windows: windows.settle(hold, actual, self._clock()))

    def _changed(self, change: Callable[[SpendWindows], T]) -> T:
        """`change` made to the agent's windows in one transaction of the file."""
        if self._db is None:
            self._db = Database(self.path)

        def work(cursor: sqlite3.Cursor) -> T:
            row = cursor.execute(
                "SELECT windows FROM tether_spend WHERE agent = ?", (self.agent,)
            ).fetchone()
            windows = SpendWindows.of(jsoncodec.loads(row[0]) if row else None)
            result = change(windows)
            cursor.execute(
                "INSERT INTO tether_spend (agent, windows) VALUES (?, ?) "
                "ON CONFLICT (agent) DO UPDATE SET windows = excluded.windows",
                (self.agent, jsoncodec.dumps(windows.to_json()).decode()),
            )
            return result

        return self._db.exclusive(work)


@dataclass(frozen=True)
class Held:
    """A call's hold in the caps: its id and the worst case it holds."""

    id: str
    worst: Spend


async def hold_spend(
    gate: SpendGate, request: ModelRequest, pricing: Pricing | None, name: str, model: str
) -> Held:
    """Hold the worst case of `request` to `model` (`provider/name`; its bytes bound its input
    tokens) in `gate`: the hold, or `SpendCapReached`."""
    tools = [(t.name, t.description, t.input_schema) for t in request.tools]
    input_tokens = len(jsoncodec.dumps([request.system, request.messages, tools]))
    output_tokens = request.max_output_tokens + (request.thinking_budget or 0)
    # short: the settled ones are kept in one state value a while
    held = Held(uuid.uuid4().hex[:16], worst_case(input_tokens, output_tokens, pricing))
    refusal = await gate.reserve(held.id, held.worst, model)
    if refusal is not None:
        raise SpendCapReached(refusal, name)
    return held


def spent(response: ModelResponse, pricing: Pricing | None) -> Spend:
    """What a call that answered cost."""
    cost = pricing.cost(response.usage) if pricing is not None else 0.0
    return Spend(cost, usage_tokens(dict(response.usage)))


def failed_spend(held: Held, sent: bool, error: BaseException | None) -> Spend:
    """What a call that did not answer may have cost: nothing when it was not sent, or the
    provider refused it with an error status or was not reached; else (it timed out, its
    stream broke or carried an error, it was cancelled while the provider answered) its worst
    case, as the provider may have charged for what it generated."""
    if not sent:
        return Spend()
    if isinstance(error, ProviderError) and not error.may_have_charged:
        return Spend()
    return held.worst
