"""`AgentStats`: what a run did and cost."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

AgentStatus = Literal["completed", "aborted", "max_turns", "budget_exceeded", "error"]


@dataclass
class AgentStats:
    """The outcome of one run. Token and cost fields count this agent only; the `total_*`
    properties add its sub-agents."""

    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    tool_calls: int = 0
    status: AgentStatus = "completed"
    text: str = ""
    children: list[AgentStats] = field(default_factory=list)
    error: str | None = None
    run_id: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    output: Any = None
    """The value of the run's final answer, for an agent with an `Output`."""

    @property
    def tokens(self) -> int:
        return (
            self.input_tokens
            + self.output_tokens
            + self.cache_read_tokens
            + self.cache_write_tokens
        )

    @property
    def total_tokens(self) -> int:
        return self.tokens + sum(c.total_tokens for c in self.children)

    @property
    def total_cost_usd(self) -> float:
        return self.cost_usd + sum(c.total_cost_usd for c in self.children)

    def to_json(self) -> dict[str, Any]:
        # by hand: `asdict` deep-copies through `copy.deepcopy`, once per run and child
        data = dict(vars(self))  # its attributes are its fields, in their order
        data["children"] = [child.to_json() for child in self.children]
        if data["output"] is None:  # as records and results were before it existed
            del data["output"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgentStats:
        children = [cls.from_json(c) for c in data.get("children", [])]
        return cls(**{**data, "children": children})
