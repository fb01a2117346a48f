"""Toolsets: tools that a run learns when it starts (an MCP server's), not when the agent is built.

A run lists each toolset in one journaled step and builds its tools from the journaled listing,
so a replay sees the tools the run started with, whatever the source offers by then.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..errors import TetherError
from ..messages import JSON
from .base import ToolDef


class ToolsetError(TetherError):
    """A toolset could not be listed; the run that needed it ends with this error."""


@runtime_checkable
class Toolset(Protocol):
    """A source of tools listed at the start of each run."""

    name: str
    """Names the listing's step (`toolset:<name>`) and the source in errors."""

    async def list_tools(self) -> JSON:
        """What the source offers now, as JSON (runs live, inside the listing's step). Raise
        `ToolsetError` when it cannot be listed."""
        ...

    def tools(self, listing: JSON) -> list[ToolDef]:
        """The tools of a journaled listing: a pure function of `listing`."""
        ...

    async def aclose(self) -> None:
        """The run is over: release connections (a later run opens them again)."""
        ...
