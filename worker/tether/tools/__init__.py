"""Tools: definitions, the `@tool` decorator, validation."""

from .base import ReplayPolicy, ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from .decorator import tool
from .spawn import spawn_tool

__all__ = [
    "ReplayPolicy",
    "ToolContext",
    "ToolDef",
    "ToolError",
    "ToolOutput",
    "ToolSpec",
    "spawn_tool",
    "tool",
]
