"""Messages for a running agent: a person (or a system) adds to the conversation while the agent
works, without waiting for the run to end.

The loop takes what arrived at turn boundaries: after a turn's tool calls, at the first such
boundary and then at most once a second (`STEERING_EVERY_MS` of journaled time: quick tool
turns do not pay a take each), the messages come after that turn's tool results, before the
model goes on; when the model has finished, always, and they start another turn (a follow-up).
What was taken is journaled, so a replay sees the same messages at the same places and a
message is never taken twice.

A take costs a journaled step (on Restate a call), so the loop first looks (`Inbox.look`, a
local read) inside the model step it journals anyway: before the model call at a tool turn's
boundary (when something came, the step journals that instead of calling the model, and the
loop takes), and after it at the answer. A boundary where nothing came costs no step.

`MemoryInbox` is the in-process inbox (any durable runtime); on Restate the worker keeps the
inbox in a virtual object of its own (`tether.programs.worker.inbox`).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from ..durable.protocol import DurableRuntime
from ..messages import JSON


class Inbox(Protocol):
    def look(self) -> bool | None:
        """Whether a message may have arrived since the last take; None when only a take can
        tell (that answer is replay-stable, so the loop may act on it anywhere). True or False
        depend on when it is asked: the loop reads them only inside a journaled step."""
        ...

    async def take(self, durable: DurableRuntime, where: str) -> list[str]:
        """The messages that arrived since the last take, journaled as the step `where`."""
        ...


class MemoryInbox:
    """Messages posted in this process (`post`), taken at the run's turn boundaries."""

    def __init__(self) -> None:
        self._waiting: deque[str] = deque()

    def post(self, message: str) -> None:
        self._waiting.append(message)

    def look(self) -> bool:
        return bool(self._waiting)

    async def take(self, durable: DurableRuntime, where: str) -> list[str]:
        async def drain() -> JSON:
            taken = list(self._waiting)
            self._waiting.clear()
            return taken

        messages: list[str] = await durable.step("decision", where, drain)
        return messages
