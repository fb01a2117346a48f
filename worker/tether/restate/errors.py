"""Recognising Restate's control-flow errors, which must always escape the agent loop."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from restate.exceptions import RetryableError, SdkInternalBaseException, TerminalError

from ..durable.errors import DurableControlError

CANCELLED_STATUS = 409


class WorkerStopping(RetryableError, DurableControlError):
    """The run's process is stopping: its attempt ends at a turn's boundary, and Restate retries
    it at once, on another replica (`RestateRuntimeOptions.stopping`)."""

    def __init__(self) -> None:
        super().__init__(
            "this worker is stopping: the run goes on on another replica from its next model step",
            status_code=503,
            retry_after=timedelta(0),
        )


def is_restate_cancellation(error: BaseException | None) -> bool:
    """True for the SDK's cancellation: the invocation was cancelled (admin API, a caller's
    `cancel_invocation`, a cancelled parent). It surfaces as `TerminalError` with status 409
    at the next durable await; Restate journals it, so a replay meets it at the same await."""
    return isinstance(error, TerminalError) and error.status_code == CANCELLED_STATUS


def is_restate_control_error(error: BaseException | None) -> bool:
    """True for errors that must propagate through the loop untouched: suspension and other
    SDK-internal signals, terminal errors (cancellation included), task cancellation, and
    Tether's own durable control errors. Turning them into tool results would make Restate
    retry or suspend the invocation incorrectly. `restate_runtime` answers
    `is_control_error` with this."""
    return isinstance(
        error,
        SdkInternalBaseException | TerminalError | asyncio.CancelledError | DurableControlError,
    )


def restate_control_error(error: BaseException | None) -> BaseException | None:
    """The Restate control error behind `error`: itself, or the first one on its `__cause__`
    / `__context__` chain. For code outside the loop that wraps failures in errors of its own:
    re-raise the original, or Restate treats it as an ordinary, retryable failure."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if is_restate_control_error(error):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
