"""The hook bus. Hooks observe and may mutate their payload; they are awaited in order.

Hooks about work (tool:*, stream:*, turn:*, context:transform) fire only when the step runs
live, never again on replay; the exceptions fire where no step runs, so on replays too, and a
hook that counts them checks `durable.is_replaying()`: `agent:done`, `turn:end` (a turn's tool
results are in, with its journaled `started_at` and `ended_at`), `park:end` (a call's wait for a
person ended: the decision, as the run's record keeps it) and the `tool:before` and `tool:after`
of a self-journaled tool (`self_journaled` in the payload, with its journaled `started_at`).
The payloads of turn:* and tool:before/after/transform name the run (`run_id`) and the turn
(`turn`).
`spawn:start` (the in-process spawn tool, before each child, on replays too) lets a hook give the
child hooks of its own: it adds them to the payload's `hooks` (a name: functions mapping).
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
        "turn:error",
        "turn:end",
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
        "spawn:start",
        "spawn:complete",
        "park:end",
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

    def wants(self, name: str) -> bool:
        """Whether any function is registered for `name` (a payload costly to build is built
        only then)."""
        return bool(self._hooks.get(name))

    async def call(self, name: str, payload: HookPayload) -> HookPayload:
        fns = self._hooks.get(name)
        if fns:  # most names have none: no copy of an empty list per call
            for fn in list(fns):
                result = fn(payload)
                if inspect.isawaitable(result):
                    await result
        return payload
