"""The lease of a replica's own keep-alives (`tether_operator.lease`), on a clock of our own; the
real thing, a stalled leader, is `test_ha.py`."""

from __future__ import annotations

import pytest

from tether_operator.lease import MARGIN, Lease, LeaseLapsed


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def held(lifetime: float = 15.0) -> tuple[Lease, Clock, list[str]]:
    clock, reasons = Clock(), []
    lease = Lease(clock)
    lease.hold(lifetime, reasons.append)
    return lease, clock, reasons


def test_keep_alives_within_the_lease_renew_it_and_writes_go_out() -> None:
    lease, clock, reasons = held()
    for _ in range(5):
        started = lease.renewing()
        assert started == clock.now
        lease.renewed(started)
        clock.now += 15.0 - MARGIN - 0.1  # kopf's keep-alives come 5-10 s apart
        lease.check("PATCH x")
    assert reasons == []


def test_a_keep_alive_after_a_stall_is_not_sent_and_the_replica_steps_down() -> None:
    lease, clock, reasons = held()
    started = lease.renewing()
    assert started is not None
    lease.renewed(started)
    clock.now += 20.0  # stopped past the others' view of its record
    assert lease.renewing() is None
    assert reasons and "went through 20.0s ago" in reasons[0]


def test_a_write_after_a_stall_is_refused() -> None:
    lease, clock, reasons = held()
    lease.renewed(clock.now)
    clock.now += 15.0 - MARGIN + 0.5
    with pytest.raises(LeaseLapsed, match="not DELETE /apis/x: this replica's lease lapsed"):
        lease.check("DELETE /apis/x")
    assert len(reasons) == 1


def test_a_keep_alive_that_failed_does_not_renew() -> None:
    lease, clock, _ = held()
    lease.renewed(clock.now)
    clock.now += 8.0
    assert lease.renewing() is not None  # sent, but it never went through: no `renewed`
    clock.now += 8.0
    with pytest.raises(LeaseLapsed):
        lease.check("PATCH x")


def test_standalone_and_before_the_first_keep_alive_nothing_lapses() -> None:
    standalone = Lease(Clock())
    standalone.check("PATCH x")
    lease, clock, reasons = held()
    clock.now += 1000.0
    lease.check("PATCH x")  # kopf keeps the replica paused until its peering is seen
    assert reasons == []
