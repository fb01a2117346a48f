"""`Behavior`: the knobs of one agent run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

CompactStrategy = Literal["tail"]
OnBudgetExhausted = Literal["stop", "ask"]


@dataclass(frozen=True)
class Behavior:
    """How a run behaves. `run(behavior=...)` overrides the agent's: a `Behavior` replaces it,
    a dict replaces only the fields it names."""

    max_turns: int = 50
    """Model calls per run before it stops with status `max_turns`."""
    max_tokens: int | None = None
    """Token budget of the run (input + output + cache, sub-agents included)."""
    max_cost_usd: float | None = None
    """Cost budget of the run in USD (sub-agents included); needs provider pricing."""
    on_budget_exhausted: OnBudgetExhausted = "stop"
    """When the next model call does not fit the budget: `"stop"` ends the run with status
    `budget_exceeded`; `"ask"` waits for a person (the agent's `wait`, as an approval), and
    an approval raises each budget by its size again, so the run goes on where it stood."""
    cache: bool = False
    """Place prompt-cache breakpoints (Anthropic)."""
    compact_strategy: CompactStrategy | None = None
    """`"tail"` drops the oldest turns, at a tool-call boundary, to fit the context window."""
    max_concurrent_tools: int = 1
    """How many concurrency-safe tool calls of one turn may run at once."""
    thinking_budget: int | None = None
    """Extended-thinking token budget, where the provider has it."""
    max_output_tokens: int = 4096
    """Output tokens per model call."""
    max_retries: int = 4
    """Retries of a retryable provider error (429, 5xx), with journaled backoff."""
    max_tool_result_bytes: int | None = 32 * 1024
    """Tool results longer than this keep their head and tail around an omission marker, so
    one large result cannot bloat the journal, the session or the context window."""

    def __post_init__(self) -> None:
        positive = {
            "max_turns": self.max_turns,
            "max_concurrent_tools": self.max_concurrent_tools,
            "max_output_tokens": self.max_output_tokens,
            "max_tokens": self.max_tokens,
            "max_cost_usd": self.max_cost_usd,
            "thinking_budget": self.thinking_budget,
            "max_tool_result_bytes": self.max_tool_result_bytes,
        }
        for name, value in positive.items():
            if value is not None and value <= 0:
                raise ValueError(f"Behavior.{name} must be positive, got {value!r}")
        if self.max_retries < 0:
            raise ValueError(f"Behavior.max_retries must be >= 0, got {self.max_retries!r}")
        if self.on_budget_exhausted not in ("stop", "ask"):
            raise ValueError(
                "Behavior.on_budget_exhausted must be 'stop' or 'ask', "
                f"got {self.on_budget_exhausted!r}"
            )
        if self.compact_strategy not in (None, "tail"):
            raise ValueError(
                f"Behavior.compact_strategy must be None or 'tail', got {self.compact_strategy!r}"
            )

    def override(self, other: Behavior | dict[str, Any] | None) -> Behavior:
        if other is None:
            return self
        if isinstance(other, Behavior):
            return other
        unknown = other.keys() - vars(self).keys()
        if unknown:
            raise ValueError(f"unknown Behavior fields: {', '.join(sorted(unknown))}")
        return type(self)(**{**vars(self), **other})  # `dataclasses.replace`, without its checks


DEFAULT_BEHAVIOR = Behavior()
"""The defaults (frozen: one instance serves every agent built without overrides)."""
