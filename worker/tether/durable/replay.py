"""Knowing when a run goes from replaying its journal to running live."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

LiveCallback = Callable[[], Awaitable[None] | None]
log = logging.getLogger("tether.replay")


class ReplayDoneHooks(Protocol):
    """The slice of a hook bus that `replay:done` needs (`tether.agent.Hooks` fits)."""

    async def call(self, name: str, payload: dict[str, Any]) -> Any: ...


class ReplayTracker:
    """Tells whether a run is still replaying its journal and notifies when it goes live.

    `is_replaying()` is true until the first step body actually runs (conservatively true at
    the very start of a fresh run too); `is_resuming()` is true only while a run that was
    built with `resuming=True` replays. `mark_live()` is called by the runtime from inside the
    first step that runs live; callbacks registered with `on_live` then run once, followed by
    the `replay:done` hook when at least one step was replayed (or the run was resuming).
    """

    def __init__(self, *, hooks: ReplayDoneHooks | None = None, resuming: bool = False) -> None:
        self.hooks = hooks
        self.resuming = resuming
        self.replayed_steps = 0
        self._live = False
        self._callbacks: list[LiveCallback] = []

    def is_replaying(self) -> bool:
        return not self._live

    def is_resuming(self) -> bool:
        return self.resuming and not self._live

    def note_replayed(self) -> None:
        self.replayed_steps += 1

    def on_live(self, callback: LiveCallback) -> Callable[[], None]:
        """Run `callback` at the replay-to-live transition; returns an unregister function.

        Registered after the transition, a synchronous callback runs at once; an async one is
        dropped (the transition has already been reported)."""
        if self._live:
            result = callback()
            if inspect.iscoroutine(result):
                result.close()
            return lambda: None
        self._callbacks.append(callback)
        return lambda: self._callbacks.remove(callback) if callback in self._callbacks else None

    async def mark_live(self) -> None:
        if self._live:
            return
        self._live = True
        if not (self.replayed_steps or self.resuming):
            self._callbacks.clear()
            return  # a fresh run: nothing was replayed, so there is no transition to report
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            result = callback()
            if inspect.isawaitable(result):
                await result
        if self.hooks is not None:
            try:
                await self.hooks.call("replay:done", {})
            except Exception:  # a listener must not break the live step that went live
                log.exception("a replay:done hook failed")
