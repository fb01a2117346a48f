"""`tether.providers.pace`: a model's calls paced to a rate (GCRA), and `Limited` waiting for
the slots."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers import RecordingProvider
from tether.providers import Limited, LocalPacer, ModelRequest, Pace, Rate


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
        model, pacer=LocalPacer(Pace(Rate(per_minute=600, burst=2))), on_waiting=waiting.append
    )
    start = time.monotonic()
    request = ModelRequest(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    await asyncio.gather(*(paced.complete(request) for _ in range(4)))
    offsets = [round(at - start, 1) for at in sent]
    assert offsets == [0.0, 0.0, 0.1, 0.2]  # two at once, then 100 ms apart
    assert max(waiting) == 2 and waiting[-1] == 0


def test_a_call_counts_its_input_tokens_and_waits_for_the_later_of_its_slots() -> None:
    # 6,000 tokens a minute (100 a second, a minute's worth at once), 60 calls a minute.
    pace = Pace(requests=Rate(60, burst=10), input_tokens=Rate(6_000))
    wait, last = pace.next_slots({}, 0, 5_000)
    assert wait == 0  # within the minute's worth
    wait, last = pace.next_slots(last, 0, 2_000)
    assert wait == pytest.approx(10_000)  # 1,000 tokens past it: 10 s at 100 a second
    # A call larger than the bucket waits for what is past it, even after a quiet while.
    assert pace.next_slots({}, 0, 9_000)[0] == pytest.approx(30_000)
    assert Pace(input_tokens=Rate(6_000)).next_slots({}, 0, 10)[1].keys() == {"input_tokens"}


async def test_paced_calls_count_the_tokens_of_their_requests() -> None:
    counted: list[int] = []

    class Counting(LocalPacer):
        async def admit(self, tokens: int) -> float:
            counted.append(tokens)
            return await super().admit(tokens)

    model = RecordingProvider([{"text": "hi"}])
    request = ModelRequest(
        messages=[{"role": "user", "content": [{"type": "text", "text": "x" * 4_000}]}]
    )
    await Limited(model, pacer=Counting(Pace(input_tokens=Rate(1_000_000)))).complete(request)
    await Limited(model, pacer=Counting(Pace(requests=Rate(60)))).complete(request)
    assert 1_000 <= counted[0] <= 1_050 and counted[1] == 0  # counted only when a rate needs it


async def test_a_worker_whose_ask_restate_does_not_answer_paces_its_own_calls(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tether.programs.restate_server import free_port
    from tether.programs.worker.ingress import IngressPoster
    from tether.programs.worker.pace_client import RestatePacer

    nobody = IngressPoster(f"http://127.0.0.1:{free_port()}", timeout=1.0)
    pacer = RestatePacer("a", "m", Pace(Rate(60, burst=1)), nobody, b"secret")
    waits, ends = [], []
    try:
        for _ in range(2):
            waits.append(await pacer.admit(0))
            ends.append(time.monotonic())
    finally:
        await nobody.close()
    # One a second, here: the second slot is a second after the first, less the time its
    # failed ask of Restate took.
    assert waits[0] == 0
    assert waits[1] == pytest.approx(1.0 - (ends[1] - ends[0]), abs=0.05)
    assert waits[1] > 0.5
    assert "paced in this process" in caplog.text
