"""A model's calls held back in this process: at most so many in flight, each at its pace, and
each within the agent's spend caps. A provider's rate limits are per key, and a worker with many
runs would otherwise send every run's call at once and get 429s back."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ..messages import estimate_tokens
from .base import ModelRequest, ModelResponse, Provider, TextCallback
from .pace import Pacer
from .spend import SpendGate, failed_spend, hold_spend, spent


class Limited:
    """`provider` with at most `max_calls` of its calls in flight at once (None: no cap), each
    sent at its slot of `pacer` (None: at once). The others wait their turn, in order, inside
    their model step (a wait is not journaled: it only delays the call, and its timeout starts
    once it is sent). With `spend`, a call first holds its worst case against the agent's
    spend caps (`SpendCapReached` when it does not fit) and settles what it spent once done.
    `on_waiting` hears how many calls wait, each time that changes (the worker's
    `tether_model_calls_waiting`)."""

    def __init__(
        self,
        provider: Provider,
        max_calls: int | None = None,
        on_waiting: Callable[[int], None] | None = None,
        *,
        pacer: Pacer | None = None,
        spend: SpendGate | None = None,
    ) -> None:
        if max_calls is not None and max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, not {max_calls}")
        self.provider = provider
        self.name = provider.name
        self.model = provider.model
        self.pricing = provider.pricing
        self.context_window = provider.context_window
        self.max_calls = max_calls
        self.pacer = pacer
        self.spend = spend
        self.spend_as = f"{provider.name}/{provider.model}"  # what a model's spend caps name
        self.on_waiting = on_waiting
        self.waiting = 0
        self._slots = asyncio.Semaphore(max_calls) if max_calls is not None else None

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        gate = self.spend
        if gate is None:
            return await self._limited(request, on_text)
        held = await hold_spend(gate, request, self.pricing, self.name, self.spend_as)
        sent: list[bool] = []  # once the provider has the call
        try:
            response = await self._limited(request, on_text, sent)
        except BaseException as error:  # failed or aborted: what it may have cost counts
            await gate.settle(held.id, failed_spend(held, bool(sent), error))
            raise
        await gate.settle(held.id, spent(response, self.pricing))
        return response

    async def _limited(
        self, request: ModelRequest, on_text: TextCallback | None, sent: list[bool] | None = None
    ) -> ModelResponse:
        slots = self._slots
        if slots is not None:
            if slots.locked():
                await self._waiting(slots.acquire())
            else:
                await slots.acquire()
        try:
            await self._paced(request)  # in flight: a slot it holds goes to it meanwhile
            if sent is not None:
                sent.append(True)
            return await self.provider.complete(request, on_text)
        finally:
            if slots is not None:
                slots.release()

    async def _paced(self, request: ModelRequest) -> None:
        pacer = self.pacer
        if pacer is None:
            return
        tokens = 0
        if pacer.pace.input_tokens is not None:  # counted only for a rate that needs them
            tools = [(t.name, t.description, t.input_schema) for t in request.tools]
            tokens = estimate_tokens([request.system, request.messages, tools])
        seconds = await pacer.admit(tokens)
        if seconds > 0:
            await self._waiting(asyncio.sleep(seconds))

    async def _waiting(self, wait: Awaitable[object]) -> None:
        self._count_waiting(+1)
        try:
            await wait
        finally:  # a run aborted while it waits leaves the queue too
            self._count_waiting(-1)

    def _count_waiting(self, change: int) -> None:
        self.waiting += change
        if self.on_waiting is not None:
            self.on_waiting(self.waiting)
