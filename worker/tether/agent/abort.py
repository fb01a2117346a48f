"""Racing work against the run's abort signal."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from ..errors import TetherError

T = TypeVar("T")


class Aborted(TetherError):
    """The run was aborted while the awaited work was in flight."""


class AbortSignal:
    """The abort state of one run: an event for tools to watch, and a future whose callbacks
    interrupt the work racing it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self._future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def set(self) -> None:
        self.event.set()
        if not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        return self.event.is_set()

    async def race(self, work: Awaitable[T]) -> T:
        """Await `work`, or cancel it and raise `Aborted` as soon as the run is aborted."""
        if self._future.done():
            if asyncio.iscoroutine(work):
                work.close()
            raise Aborted
        # Every model and tool call races, so the work runs in the caller's task (no task of its
        # own per call): an abort cancels that task, as `asyncio.timeout` does, and the
        # cancellation it caused is taken back here. One from elsewhere still propagates.
        task = asyncio.current_task()
        assert task is not None, "race() runs in a task"
        interrupted = racing = False

        def interrupt(_: object) -> None:
            nonlocal interrupted
            if racing:  # it may run after the race ended: the future's callbacks are scheduled
                interrupted = True
                task.cancel()

        self._future.add_done_callback(interrupt)
        racing = True
        try:
            result = await work
        except asyncio.CancelledError:
            if interrupted and task.uncancel() == 0:
                raise Aborted from None
            raise
        finally:
            racing = False
            self._future.remove_done_callback(interrupt)
        if interrupted and task.uncancel() == 0:  # the work swallowed the cancellation
            raise Aborted
        return result
