"""`tether.providers.Limited`: a cap on a model's calls in flight in one process."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tether import create_agent
from tether.providers import Limited, ModelResponse, scripted


class Held:
    """A model whose calls wait until the test lets them answer."""

    name, model, pricing, context_window = "held", "held-1", None, 100_000

    def __init__(self) -> None:
        self.in_flight = self.most = 0
        self.go = asyncio.Event()

    async def complete(self, request: Any, on_text: Any = None) -> ModelResponse:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.go.wait()
        finally:
            self.in_flight -= 1
        return ModelResponse(content=[{"type": "text", "text": "ok"}], usage={"input": 1})


async def until(condition: Any) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never")


async def test_calls_past_the_cap_wait_their_turn_and_are_counted_while_they_wait() -> None:
    held = Held()
    counts: list[int] = []
    limited = Limited(held, 2, on_waiting=counts.append)  # type: ignore[arg-type]
    agents = [create_agent(provider=limited) for _ in range(5)]
    runs = [asyncio.create_task(a.run("hi")) for a in agents]
    await until(lambda: limited.waiting == 3)
    assert (held.in_flight, counts) == (2, [1, 2, 3])
    held.go.set()
    stats = await asyncio.gather(*runs)
    assert [s.status for s in stats] == ["completed"] * 5
    assert held.most == 2 and limited.waiting == 0 and counts[-1] == 0


async def test_a_run_aborted_while_it_waits_leaves_the_queue() -> None:
    held = Held()
    limited = Limited(held, 1)  # type: ignore[arg-type]
    first, second = create_agent(provider=limited), create_agent(provider=limited)
    running = asyncio.create_task(first.run("hi"))
    waiting = asyncio.create_task(second.run("hi"))
    await until(lambda: limited.waiting == 1)
    second.abort()
    assert (await waiting).status == "aborted"
    assert limited.waiting == 0
    held.go.set()
    assert (await running).status == "completed"


def test_it_passes_on_what_the_loop_reads_of_its_model_and_refuses_no_cap() -> None:
    model = scripted([{"text": "x"}], model="m", context_window=1234)
    limited = Limited(model, 1)
    assert (limited.name, limited.model, limited.context_window) == ("scripted", "m", 1234)
    with pytest.raises(ValueError, match="max_calls must be at least 1"):
        Limited(model, 0)
