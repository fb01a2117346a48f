"""`AbortSignal.race`: the work runs in the caller's task, and an abort interrupts only it."""

from __future__ import annotations

import asyncio

import pytest

from tether.agent.abort import Aborted, AbortSignal


async def test_an_abort_cancels_the_work_and_raises_aborted() -> None:
    signal = AbortSignal()
    seen: list[str] = []

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        return "done"

    asyncio.get_running_loop().call_later(0.01, signal.set)
    with pytest.raises(Aborted):
        await signal.race(work())
    assert seen == ["cancelled"]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0)  # and the task goes on undisturbed


async def test_a_cancellation_from_elsewhere_still_propagates() -> None:
    signal = AbortSignal()
    racing = asyncio.ensure_future(signal.race(asyncio.sleep(30)))
    await asyncio.sleep(0.01)
    racing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await racing


async def test_an_abort_as_the_work_ends_does_not_cancel_what_follows() -> None:
    """The abort's callback is scheduled by the loop; if it runs after the race returned, it
    must not cancel whatever the task awaits next."""
    signal = AbortSignal()
    gate = asyncio.get_running_loop().create_future()

    async def work() -> str:
        await gate
        return "done"

    def finish_and_abort() -> None:
        gate.set_result(None)  # the racer wakes first...
        signal.set()  # ...then the abort's callback, after it

    asyncio.get_running_loop().call_soon(finish_and_abort)
    assert await signal.race(work()) == "done"
    await asyncio.sleep(0.01)  # a stray cancellation would land here
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_work_that_swallows_the_cancellation_is_still_aborted() -> None:
    signal = AbortSignal()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "ignored it"
        return "done"

    asyncio.get_running_loop().call_later(0.01, signal.set)
    with pytest.raises(Aborted):
        await signal.race(stubborn())
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_an_aborted_signal_does_not_start_the_work() -> None:
    signal = AbortSignal()
    signal.set()
    started: list[bool] = []

    async def work() -> None:
        started.append(True)

    with pytest.raises(Aborted):
        await signal.race(work())
    assert started == []
