"""The hook bus. Hooks observe and may mutate their payload; they are awaited in order.

Hooks about work (tool:*, stream:*, turn:*, context:transform) fire only when the step runs
live, never again on replay.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

HookPayload = dict[str, Any]
HookFn = Callable[[HookPayload], Awaitable[None] | None]

HOOK_NAMES = frozenset(
    {
        "turn:before",
        "turn:after",
        "stream:text",
        "stream:end",
        "tool:gate",
        "tool:before",
        "tool:after",
        "tool:error",
        "tool:transform",
        "context:transform",
        "agent:done",
        "agent:abort",
        "replay:done",
        "spawn:complete",
    }
)

HooksInit = Mapping[str, HookFn | Sequence[HookFn]]


class Hooks:
    """Named lists of hook functions."""

    def __init__(self, initial: HooksInit | None = None) -> None:
        self._hooks: dict[str, list[HookFn]] = {}
        for name, fns in (initial or {}).items():
            for fn in [fns] if callable(fns) else fns:
                self.on(name, fn)

    def on(self, name: str, fn: HookFn) -> Callable[[], None]:
        """Register `fn` for `name`; returns a function that unregisters it."""
        if name not in HOOK_NAMES:
            raise ValueError(f"unknown hook {name!r}; known hooks: {', '.join(sorted(HOOK_NAMES))}")
        self._hooks.setdefault(name, []).append(fn)
        return lambda: self._hooks[name].remove(fn)

    async def call(self, name: str, payload: HookPayload) -> HookPayload:
        for fn in list(self._hooks.get(name, ())):
            result = fn(payload)
            if inspect.isawaitable(result):
                await result
        return payload
