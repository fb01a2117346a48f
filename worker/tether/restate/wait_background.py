"""`restate_wait_background`: wait durably for a host's background task to exit.

Ordering contract: mint the awakeable, register it as the task's exit resumer (journaled),
THEN probe the host's task registry (journaled). A task that exits after the register is
resumed through the awakeable; one that exited before is seen by the probe. Either way no exit
is missed, and neither step runs again on a replay.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from restate.exceptions import TerminalError

from ..tools.base import ToolError
from .awakeable_tool import (
    PAYLOAD_SERDE,
    check_published,
    mark_live,
    maybe_await,
    park,
    rejection_message,
)
from .errors import is_restate_cancellation
from .runtime import journal_options
from .types import RestateWaitBackgroundOptions

RUNNING = "running"


class WaitBackground(Protocol):
    """`await wait(handle, task_id, timeout_ms=None)`: the task's exit info, or None on timeout
    or for a task the host does not know."""

    def __call__(
        self, handle: Any, task_id: str, *, timeout_ms: float | None = None
    ) -> Awaitable[dict[str, Any] | None]: ...


def find_task(entries: list[dict[str, Any]], task_id: str) -> dict[str, Any] | None:
    """The registry entry of `task_id` (entries carry `id`, or `task_id`)."""
    for entry in entries:
        if entry.get("id", entry.get("task_id")) == task_id:
            return entry
    return None


def exit_info(entry: dict[str, Any]) -> dict[str, Any]:
    """A terminated entry's exit info: its `exit` record when it has one, else the entry."""
    found = entry.get("exit")
    return found if isinstance(found, dict) else entry


def exit_payload(value: Any) -> dict[str, Any] | None:
    """The resumer's payload as exit info (a bare value is wrapped as `{"value": ...}`)."""
    if value is None or isinstance(value, dict):
        return value
    return {"value": value}


def restate_wait_background(options: RestateWaitBackgroundOptions) -> WaitBackground:
    """A durable wait for a host's background task: `await wait(handle, task_id,
    timeout_ms=None)` returns the task's exit info, or None.

    Per call, in `options.ctx`'s journal (entries `<entry_prefix>-<n>-register`, `-probe`,
    `-settle`):

    1. mint an awakeable and `register(awakeable_id, task_id, handle)` it as the task's exit
       resumer (journaled; the host must later resolve the awakeable with the exit info);
    2. `probe(handle, task_id)` snapshots the host's tasks (journaled). Each entry is a dict
       with `id` and `status` (`"running"` while the task lives) and optionally `exit`. A
       terminated task returns at once (its `exit`, else the entry); a running one parks on
       the awakeable outside the journal, raced against a durable `ctx.sleep` when a timeout
       applies (`timeout_ms` of the call, else of the options; None on timeout); a task the
       registry does not list gives None;
    3. `settle(awakeable_id, task_id, exit, handle)`, when given, finalises the resumer
       (journaled).

    A rejected awakeable raises `ToolError` (after settling with None), which a tool turns into
    an error result; a Restate cancellation propagates unchanged.
    """
    ctx = options.ctx
    run_options = journal_options(options.run_options)
    tracker = options.replay_tracker
    sequence = itertools.count(1)

    async def journal(name: str, body: Callable[[], Awaitable[Any]]) -> Any:
        async def action() -> Any:
            await mark_live(tracker)
            return await body()

        return await ctx.run_typed(name, action, run_options)

    async def wait(
        handle: Any, task_id: str, *, timeout_ms: float | None = None
    ) -> dict[str, Any] | None:
        prefix = f"{options.entry_prefix}-{next(sequence)}"
        awakeable_id, promise = ctx.awakeable(serde=PAYLOAD_SERDE)

        async def register() -> str:
            await maybe_await(options.register(awakeable_id, task_id, handle))
            return awakeable_id

        async def probe() -> list[dict[str, Any]]:
            return list(await maybe_await(options.probe(handle, task_id)))

        async def settle(exited: dict[str, Any] | None) -> None:
            if options.settle is not None:
                settle_fn = options.settle

                async def body() -> bool:
                    await maybe_await(settle_fn(awakeable_id, task_id, exited, handle))
                    return True

                await journal(f"{prefix}-settle", body)

        check_published(
            f"{prefix}-register", await journal(f"{prefix}-register", register), awakeable_id
        )
        entry = find_task(await journal(f"{prefix}-probe", probe), task_id)
        if entry is None:
            await settle(None)
            return None
        if entry.get("status") != RUNNING:
            found = exit_info(entry)
            await settle(found)
            return found
        deadline = timeout_ms if timeout_ms is not None else options.timeout_ms
        try:
            outcome = await park(ctx, promise, deadline, options.promises)
        except TerminalError as error:
            if is_restate_cancellation(error):
                raise
            await settle(None)
            reason = rejection_message(error)
            raise ToolError(f"the wait for task {task_id} was rejected: {reason}") from None
        exited = None if outcome.timed_out else exit_payload(outcome.value)
        await settle(exited)
        return exited

    return wait
