"""This replica's hold on the lead, as its own keep-alives prove it (see `peering.py`).

Other replicas take this one for dead `lifetime` seconds after the last keep-alive it sent. One
that stalls longer (stopped, starved of CPU, cut off from the API server) may find, when it comes
back, that another replica led meanwhile. kopf alone would let it lead again (it is older) and
make the other step down, so the replica that missed what happened would go on. The lease turns
that around:

- it counts from the start of each keep-alive that went through (`renewed`);
- a keep-alive due more than `lifetime - MARGIN` seconds after the last one that went through is
  not sent, and one still going by then is cancelled: the lead may have passed, so this replica
  steps down (`peering.step_down`) and the one that led meanwhile goes on;
- no write to the cluster or to Restate leaves a replica whose lease has lapsed (`check`, before
  each one): it steps down instead.

A write that passed `check` just before a stall can still land after it; the lease narrows the
window to that one write. Keep-alives themselves are fenced (`peering.fenced_keep_alive`): one
that lands late, after another replica wrote to the peering object, is refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import kopf

from tether.errors import TetherError

MARGIN = 2.0
"""Seconds the lease ends before the others' view of it: for the clocks of two nodes (kept in
step by NTP) and the keep-alive's own request."""


class LeaseLapsed(TetherError, kopf.TemporaryError):
    """A write refused: this replica's lease lapsed, and it is stepping down (for kopf, a
    handler's temporary failure: one line in the log, no traceback, while it stops)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, delay=1.0)


class Lease:
    """The lead as held by this replica's keep-alives; inactive until `hold`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.lifetime: float | None = None
        self._renewed: float | None = None
        self._on_lapse: Callable[[str], None] = lambda reason: None

    def hold(self, lifetime: float, on_lapse: Callable[[str], None]) -> None:
        """Keep-alives every few seconds, each valid `lifetime` seconds; `on_lapse(reason)` once
        the lease is found lapsed (it steps the replica down)."""
        self.lifetime, self._on_lapse = lifetime, on_lapse

    def lapsed_for(self, now: float) -> float | None:
        """Seconds since the last keep-alive that went through, when more than the lease allows;
        None while it holds, and before the first one (kopf keeps the replica paused until
        then)."""
        if self.lifetime is None or self._renewed is None:
            return None
        since = now - self._renewed
        return since if since > self.lifetime - MARGIN else None

    async def renew(self, send: Callable[[], Awaitable[None]]) -> None:
        """Send a keep-alive (`send`) unless the lease has lapsed, and count it once it went
        through. One still going when the lease lapses is cancelled: landing later, its record
        (stamped when it was made) could come back to life after the others took it for dead
        and one of them led. Either way the replica then steps down."""
        started = self.clock()
        since = self.lapsed_for(started)
        if since is not None:
            self._on_lapse(lapsed(since))
            return
        assert self.lifetime is not None
        left = None if self._renewed is None else self._renewed + self.lifetime - MARGIN - started
        try:
            await asyncio.wait_for(send(), timeout=left)
        except TimeoutError:
            self._on_lapse(lapsed(self.clock() - (self._renewed or started)))
            return
        self._renewed = started

    def check(self, what: str) -> None:
        """Before a write: raise `LeaseLapsed` (the replica steps down) if the lease lapsed."""
        since = self.lapsed_for(self.clock())
        if since is not None:
            self._on_lapse(lapsed(since))
            raise LeaseLapsed(f"not {what}: {lapsed(since)}")


def lapsed(since: float) -> str:
    return (
        f"this replica's lease lapsed: its last keep-alive went through {since:.1f}s ago, so "
        "another replica may have led meanwhile"
    )


Guard = Callable[[str], None]
"""Called with what is about to be written, before it is: `Lease.check`."""
