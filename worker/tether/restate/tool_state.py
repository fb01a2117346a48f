"""`restate_tool_state_store`: per-session tool state in the virtual object's state."""

from __future__ import annotations

from typing import Any

from ..session.store import check_value_size
from .types import RestateObjectContextLike, RestateToolStateStoreOptions

DEFAULT_TOOL_STATE_KEY = "tether_tool_state"
"""The state key holding the tool-state map. The reference (zidane) uses "zidane_tool_state";
Tether uses its own name so the two never share state by accident."""


class RestateToolStateStore:
    """One JSON map `{tool: {key: value}}` under one state key, loaded once per invocation.
    Single writer, like the session store: build it inside the handler, per invocation."""

    def __init__(self, ctx: RestateObjectContextLike, key: str, max_value_bytes: int) -> None:
        self._ctx = ctx
        self._key = key
        self._limit = max_value_bytes
        self._map: dict[str, dict[str, Any]] | None = None

    async def _loaded(self) -> dict[str, dict[str, Any]]:
        if self._map is None:
            self._map = await self._ctx.get(self._key) or {}
        return self._map

    async def get(self, tool: str, key: str) -> Any:
        return (await self._loaded()).get(tool, {}).get(key)

    async def set(self, tool: str, key: str, value: Any) -> None:
        check_value_size(tool, key, value, self._limit)
        state = await self._loaded()
        state.setdefault(tool, {})[key] = value
        self._ctx.set(self._key, state)

    async def delete(self, tool: str, key: str) -> None:
        state = await self._loaded()
        if key in state.get(tool, {}):
            del state[tool][key]
            self._ctx.set(self._key, state)


def restate_tool_state_store(
    ctx: RestateObjectContextLike,
    options: RestateToolStateStoreOptions | None = None,
) -> RestateToolStateStore:
    """A `ToolStateStore` over the bound virtual object's state (`options.key`, default
    `DEFAULT_TOOL_STATE_KEY`), with a per-value budget (default 64 KiB). The map is a schema you
    own: a value written by an earlier deploy is still there after you change its shape."""
    options = options or RestateToolStateStoreOptions()
    return RestateToolStateStore(
        ctx, options.key or DEFAULT_TOOL_STATE_KEY, options.max_value_bytes
    )
