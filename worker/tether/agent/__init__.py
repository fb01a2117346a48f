"""The agent loop."""

from .agent import Agent, AgentBusyError, create_agent
from .behavior import Behavior
from .hooks import HOOK_NAMES, Hooks
from .inbox import Inbox, MemoryInbox
from .output import Output
from .spawn import Subagent, spawn_tool
from .stats import AgentStats, AgentStatus

__all__ = [
    "HOOK_NAMES",
    "Agent",
    "AgentBusyError",
    "AgentStats",
    "AgentStatus",
    "Behavior",
    "Hooks",
    "Inbox",
    "MemoryInbox",
    "Output",
    "Subagent",
    "create_agent",
    "spawn_tool",
]
