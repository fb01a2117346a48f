"""`Sidecar`: what the request handlers share (settings, the Restate client, the parked-call
reader, the replay guard and the resolution ledger), kept on `app.state.sidecar`, and the one
way to answer a parked call with them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

from fastapi import Depends
from starlette.requests import Request

from .auth import ReplayGuard
from .ledger import ResolutionLedger
from .parked_calls import ParkedCalls
from .restate_client import RestateClient
from .settings import SidecarSettings

log = logging.getLogger("tether.sidecar")
Forward = Callable[[], Awaitable[None]]
T = TypeVar("T")


@dataclass
class Sidecar:
    settings: SidecarSettings
    restate: RestateClient
    parked: ParkedCalls
    replay_guard: ReplayGuard = field(default_factory=ReplayGuard)
    ledger: ResolutionLedger = field(default_factory=ResolutionLedger)

    async def answer(
        self, awakeable_id: str, how: str, forward: Forward, *, approver: str | None = None
    ) -> None:
        """Answer a parked call once: ledger claim, parked check, then `forward` to Restate.
        If any of it fails the call stays answerable. The log line names the approver, if
        known (an audit trail next to the value Restate keeps)."""
        self.ledger.claim(awakeable_id)
        try:
            await self.parked.require(awakeable_id)
            await forward()
        except BaseException:
            self.ledger.release(awakeable_id)
            raise
        self.ledger.done(awakeable_id, how)
        self.parked.forget(awakeable_id)
        if approver is None:
            log.info("awakeable %s %s", awakeable_id, how)
        else:
            log.info("awakeable %s %s (approver %r)", awakeable_id, how, approver)

    async def once(self, signature: str, timestamp: int, act: Callable[[], Awaitable[T]]) -> T:
        """`act()` for a signed request that is accepted once (replay guard); if it fails,
        nothing happened and the sender may retry it."""
        self.replay_guard.claim(signature, timestamp)
        try:
            return await act()
        except BaseException:
            self.replay_guard.release(signature)
            raise


async def sidecar_of(request: Request) -> Sidecar:
    sidecar: Sidecar = request.app.state.sidecar
    return sidecar


SidecarDep = Annotated[Sidecar, Depends(sidecar_of)]
"""The shared state, as a FastAPI dependency."""
