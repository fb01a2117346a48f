"""Tether: durable AI agents. Every model call, tool call and loop decision is a journaled step."""

from .agent import Agent, AgentStats, Behavior, create_agent
from .tools import ToolContext, ToolDef, ToolSpec, tool

__all__ = [
    "Agent",
    "AgentStats",
    "Behavior",
    "ToolContext",
    "ToolDef",
    "ToolSpec",
    "create_agent",
    "tool",
]
