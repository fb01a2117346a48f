"""The lease of a replica's own keep-alives (`tether_operator.lease`), on a clock of our own; the
real thing, a leader stalled or cut off from the API server, is `test_ha.py`."""

from __future__ import annotations

import asyncio

import pytest

from tether_operator.lease import MARGIN, Lease, LeaseLapsed

LIFETIME = 15.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class KeepAlives:
    """A stand-in for kopf's `touch`: counts the keep-alives sent, taking `takes` seconds."""

    def __init__(self, takes: float = 0.0) -> None:
        self.sent = 0
        self.takes = takes

    async def send(self) -> None:
        self.sent += 1
        await asyncio.sleep(self.takes)


def held() -> tuple[Lease, Clock, list[str]]:
    clock, reasons = Clock(), []
    lease = Lease(clock)
    lease.hold(LIFETIME, reasons.append)
    return lease, clock, reasons


def test_keep_alives_within_the_lease_renew_it_and_writes_go_out() -> None:
    lease, clock, reasons = held()
    keep_alives = KeepAlives()
    for _ in range(5):
        asyncio.run(lease.renew(keep_alives.send))
        clock.now += LIFETIME - MARGIN - 0.1  # kopf's keep-alives come 5-10 s apart
        lease.check("PATCH x")
    assert keep_alives.sent == 5 and reasons == []


def test_a_keep_alive_after_a_stall_is_not_sent_and_the_replica_steps_down() -> None:
    lease, clock, reasons = held()
    keep_alives = KeepAlives()
    asyncio.run(lease.renew(keep_alives.send))
    clock.now += 20.0  # stopped past the others' view of its record
    asyncio.run(lease.renew(keep_alives.send))
    assert keep_alives.sent == 1
    assert reasons and "went through 20.0s ago" in reasons[0]


def test_a_write_after_a_stall_is_refused() -> None:
    lease, clock, reasons = held()
    asyncio.run(lease.renew(KeepAlives().send))
    clock.now += LIFETIME - MARGIN + 0.5
    with pytest.raises(LeaseLapsed, match="not DELETE /apis/x: this replica's lease lapsed"):
        lease.check("DELETE /apis/x")
    assert len(reasons) == 1


def test_a_keep_alive_still_going_when_the_lease_lapses_is_cancelled() -> None:
    """kopf retries a keep-alive that fails (the API server is cut off) with the record it made
    at first: landing late, it would make that record live again after the others gave up on
    it. It is given only what is left of the lease."""
    lease, clock, reasons = held()
    asyncio.run(lease.renew(KeepAlives().send))
    clock.now += LIFETIME - MARGIN - 0.05  # 50 ms of the lease left
    slow = KeepAlives(takes=5.0)
    asyncio.run(lease.renew(slow.send))
    assert slow.sent == 1 and len(reasons) == 1
    clock.now += 0.1  # as long as it was given, and a little
    with pytest.raises(LeaseLapsed):  # it did not renew the lease
        lease.check("PATCH x")


def test_standalone_and_before_the_first_keep_alive_nothing_lapses() -> None:
    Lease(Clock()).check("PATCH x")
    lease, clock, reasons = held()
    clock.now += 1000.0
    lease.check("PATCH x")  # kopf keeps the replica paused until its peering is seen
    assert reasons == []
