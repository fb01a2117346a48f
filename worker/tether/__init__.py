"""Tether: durable AI agents. Every model call, tool call and loop decision is a journaled step.

The names below load on first use (`tether._lazy`): importing one module of the package, such as
`tether.spec`, loads only what that module needs.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

EXPORTS = {
    ".agent": ("Agent", "AgentStats", "Behavior", "Output", "create_agent"),
    ".durable.errors": ("DurableControlError", "JournalMismatchError", "RunLeasedError"),
    ".errors": ("ConfigError", "TetherError"),
    ".providers.base": ("ProviderError",),
    ".tools": ("ToolContext", "ToolDef", "ToolError", "ToolSpec", "tool"),
}
__getattr__, __dir__ = lazy_exports(__name__, EXPORTS)
__all__ = [
    "Agent",
    "AgentStats",
    "Behavior",
    "ConfigError",
    "DurableControlError",
    "JournalMismatchError",
    "Output",
    "ProviderError",
    "RunLeasedError",
    "TetherError",
    "ToolContext",
    "ToolDef",
    "ToolError",
    "ToolSpec",
    "create_agent",
    "tool",
]

if TYPE_CHECKING:  # what the names are, for type checkers
    from .agent import Agent, AgentStats, Behavior, Output, create_agent
    from .durable.errors import DurableControlError, JournalMismatchError, RunLeasedError
    from .errors import ConfigError, TetherError
    from .providers.base import ProviderError
    from .tools import ToolContext, ToolDef, ToolError, ToolSpec, tool
