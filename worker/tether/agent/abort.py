"""Racing work against the run's abort signal."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable
from typing import TypeVar

from ..errors import TetherError

T = TypeVar("T")


class Aborted(TetherError):
    """The run was aborted while the awaited work was in flight."""


class AbortSignal:
    """The abort state of one run: an event for tools to watch, and a future to race work
    against without a waiter task per call."""

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
        # Every model and tool call races: rather than `asyncio.wait` (its sets, and a done
        # callback that takes a loop pass of its own), the work's task wakes the racer as it
        # ends, and an abort wakes it through a callback.
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(_waking(work, waiter))
        on_abort = functools.partial(_wake, waiter)
        self._future.add_done_callback(on_abort)
        try:
            await waiter
        finally:
            self._future.remove_done_callback(on_abort)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise Aborted


def _wake(waiter: asyncio.Future[None], _: object = None) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _waking(work: Awaitable[T], waiter: asyncio.Future[None]) -> T:
    """`work`, then wake whoever waits on `waiter`, however it ended."""
    try:
        return await work
    finally:
        _wake(waiter)
