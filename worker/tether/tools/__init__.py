"""Tools: definitions, the `@tool` decorator, validation."""

from .base import ReplayPolicy, ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from .decorator import tool

__all__ = [
    "ReplayPolicy",
    "ToolContext",
    "ToolDef",
    "ToolError",
    "ToolOutput",
    "ToolSpec",
    "tool",
]
