"""Tether: durable AI agents. Every model call, tool call and loop decision is a journaled step."""

from .agent import Agent, AgentStats, Behavior, create_agent
from .durable.errors import DurableControlError, JournalMismatchError, RunLeasedError
from .errors import ConfigError, TetherError
from .providers.base import ProviderError
from .tools import ToolContext, ToolDef, ToolError, ToolSpec, tool

__all__ = [
    "Agent",
    "AgentStats",
    "Behavior",
    "ConfigError",
    "DurableControlError",
    "JournalMismatchError",
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
