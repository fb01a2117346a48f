"""Replay tracking for Restate invocations."""

from __future__ import annotations

from collections.abc import Callable

from ..durable.replay import ReplayTracker
from .types import ReplayTrackerOptions


def create_replay_tracker(options: ReplayTrackerOptions | None = None) -> ReplayTracker:
    """A per-invocation replay tracker. Pass it to `restate_runtime` (and `restate_tool`,
    `restate_wait_background`) as `replay_tracker`; read it with `is_replaying()`,
    `is_resuming()` and `on_live()`, or wrap aborts with `replay_aware_abort`."""
    options = options or ReplayTrackerOptions()
    return ReplayTracker(hooks=options.hooks, resuming=options.resuming)


def replay_aware_abort(tracker: ReplayTracker, abort: Callable[[], None]) -> Callable[[], None]:
    """Wrap an abort function so it defers during journal replay.

    Live: `abort()` runs at once. Replaying: the abort is queued and applied at the first step
    that runs live, so the abort's journal entries append to the journal instead of forking it
    mid-replay. Several calls during replay collapse into one."""
    queued = False

    def deferred() -> None:
        nonlocal queued
        if not tracker.is_replaying():
            abort()
            return
        if not queued:
            queued = True
            tracker.on_live(abort)

    return deferred
