"""Messages for a running agent: a person (or a system) adds to the conversation while the agent
works, without waiting for the run to end.

The loop takes what arrived at turn boundaries: after a turn's tool calls, the messages join
that turn's tool results (the model reads them before it goes on), at the first such boundary
and then at most once a second (`STEERING_EVERY_MS` of journaled time: quick tool turns do not
pay a take each); when the model has finished, always, and they start another turn (a
follow-up). What was taken is journaled, so a replay sees the same messages at the same places
and a message is never taken twice.

`MemoryInbox` is the in-process inbox (any durable runtime); on Restate the worker keeps the
inbox in a virtual object of its own (`tether.programs.worker.inbox`).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from ..durable.protocol import DurableRuntime
from ..messages import JSON


class Inbox(Protocol):
    async def take(self, durable: DurableRuntime, where: str) -> list[str]:
        """The messages that arrived since the last take, journaled as the step `where`."""
        ...


class MemoryInbox:
    """Messages posted in this process (`post`), taken at the run's turn boundaries."""

    def __init__(self) -> None:
        self._waiting: deque[str] = deque()

    def post(self, message: str) -> None:
        self._waiting.append(message)

    async def take(self, durable: DurableRuntime, where: str) -> list[str]:
        async def drain() -> JSON:
            taken = list(self._waiting)
            self._waiting.clear()
            return taken

        messages: list[str] = await durable.step("decision", where, drain)
        return messages
