"""Racing work against the run's abort signal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Aborted(Exception):
    """The run was aborted while the awaited work was in flight."""


async def race_abort(work: Awaitable[T], abort: asyncio.Event) -> T:
    """Await `work`, or cancel it and raise `Aborted` as soon as `abort` is set."""
    if abort.is_set():
        if asyncio.iscoroutine(work):
            work.close()
        raise Aborted
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(abort.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise Aborted
