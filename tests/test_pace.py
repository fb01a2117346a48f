"""`tether.providers.pace`: a model's calls paced to a rate (GCRA), and `Limited` waiting for
the slots."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers import RecordingProvider
from tether.providers import Limited, LocalPacer, ModelRequest, Rate


def test_calls_go_an_interval_apart_after_a_burst() -> None:
    rate = Rate(per_minute=60, burst=3)  # one a second, three at once
    last, waits = 0.0, []
    for _ in range(5):
        wait, last = rate.next_slot(last, 10_000)
        waits.append(wait)
    assert waits == [0, 0, 0, 1000, 2000]
    # Quiet for long enough, the burst is back; after a shorter quiet, part of it.
    assert rate.next_slot(last, 20_000)[0] == 0
    assert rate.next_slot(last, 12_500)[0] == pytest.approx(500)


def test_a_rate_without_a_burst_lets_a_minutes_worth_go_at_once() -> None:
    rate, last = Rate(per_minute=4), 0.0
    waits = []
    for _ in range(5):
        wait, last = rate.next_slot(last, 0)
        waits.append(wait)
    assert waits == [0, 0, 0, 0, 15_000]


@pytest.mark.parametrize("rate", [{"per_minute": 0}, {"per_minute": 5, "burst": 0}])
def test_a_rate_needs_calls_and_a_burst(rate: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Rate(**rate)


async def test_paced_calls_wait_for_their_slots_in_order_and_are_counted() -> None:
    sent: list[float] = []
    waiting: list[int] = []

    class Stamped(RecordingProvider):
        async def complete(self, request, on_text=None):  # type: ignore[no-untyped-def]
            sent.append(time.monotonic())
            return await super().complete(request, on_text)

    model = Stamped([{"text": "hi"}])
    paced = Limited(
        model, pacer=LocalPacer(Rate(per_minute=600, burst=2)), on_waiting=waiting.append
    )
    start = time.monotonic()
    request = ModelRequest(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    await asyncio.gather(*(paced.complete(request) for _ in range(4)))
    offsets = [round(at - start, 1) for at in sent]
    assert offsets == [0.0, 0.0, 0.1, 0.2]  # two at once, then 100 ms apart
    assert max(waiting) == 2 and waiting[-1] == 0
