"""Session records: turns (the conversation) and runs (one `agent.run` each)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..messages import ContentBlock, Role, Usage

RunStatus = Literal[
    "running", "completed", "aborted", "max_turns", "budget_exceeded", "error", "interrupted"
]


@dataclass
class SessionTurn:
    """One message of the conversation, with the id and time it was recorded."""

    id: str
    role: Role
    content: list[ContentBlock]
    created_at: float
    """Epoch milliseconds on the run's journaled clock."""
    usage: Usage | None = None
    run_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        # Shallow on purpose (no deep copy of the content blocks): it runs on every replay.
        return {
            "id": self.id,
            "role": self.role,
            "content": self.content,
            "created_at": self.created_at,
            "usage": self.usage,
            "run_id": self.run_id,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionTurn:
        return cls(**data)


@dataclass
class SessionRun:
    """The record of one run over the session."""

    id: str
    status: RunStatus
    started_at: float
    ended_at: float | None = None
    prompt: str | None = None
    stats: dict[str, Any] | None = None
    parent_run_id: str | None = None
    """Set on a sub-agent's run merged into its parent's session."""
    parent_call_id: str | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """People's decisions on the run's calls (approvals, answers to `ask_human`): which call,
    what was decided, and by whom and when where the answer says so. The audit trail."""

    def to_json(self) -> dict[str, Any]:
        # shallow (`asdict` deep-copies): what a store keeps, it encodes or copies; a record's
        # attributes are its fields, in their order
        return dict(vars(self))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionRun:
        return cls(**data)


@dataclass
class Earlier:
    """What a session read from its end leaves out: the turns and run records before the ones
    it holds, and among them the assistant turns and the sub-agents' runs."""

    turns: int = 0
    assistant_turns: int = 0
    runs: int = 0
    child_runs: int = 0


@dataclass
class SessionRecord:
    """What a store holds about one session: all of it, or (`earlier`) its newest records."""

    id: str
    created_at: float
    metadata: dict[str, Any] = field(default_factory=dict)
    turns: list[SessionTurn] = field(default_factory=list)
    runs: list[SessionRun] = field(default_factory=list)
    earlier: Earlier = field(default_factory=Earlier)
