"""`Sidecar`: what the request handlers share (settings, the Restate client, the parked-call
reader, the replay guard and the resolution ledger), kept on `app.state.sidecar`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends
from starlette.requests import Request

from .auth import ReplayGuard
from .ledger import ResolutionLedger
from .parked_calls import ParkedCalls
from .restate_client import RestateClient
from .settings import SidecarSettings


@dataclass
class Sidecar:
    settings: SidecarSettings
    restate: RestateClient
    parked: ParkedCalls
    replay_guard: ReplayGuard = field(default_factory=ReplayGuard)
    ledger: ResolutionLedger = field(default_factory=ResolutionLedger)


async def sidecar_of(request: Request) -> Sidecar:
    sidecar: Sidecar = request.app.state.sidecar
    return sidecar


SidecarDep = Annotated[Sidecar, Depends(sidecar_of)]
"""The shared state, as a FastAPI dependency."""
