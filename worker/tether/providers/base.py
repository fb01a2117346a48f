"""The Provider protocol: one model call in, one assistant message out."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..errors import TetherError
from ..messages import ContentBlock, Message, Usage
from ..tools.base import ToolSpec

TextCallback = Callable[[str], Awaitable[None]]
"""Receives each streamed text delta while the model answers (live runs only)."""


@dataclass(frozen=True)
class Pricing:
    """USD per million tokens; cache prices default to the input price."""

    input_per_mtok: float
    output_per_mtok: float
    cache_read_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None

    def cost(self, usage: Usage) -> float:
        cache_read = self.cache_read_per_mtok
        cache_write = self.cache_write_per_mtok
        total = (
            usage["input"] * self.input_per_mtok
            + usage["output"] * self.output_per_mtok
            + usage.get("cache_read", 0)
            * (self.input_per_mtok if cache_read is None else cache_read)
            + usage.get("cache_write", 0)
            * (self.input_per_mtok if cache_write is None else cache_write)
        )
        return total / 1_000_000


@dataclass
class ModelRequest:
    """Everything a provider needs for one call, in the neutral message format."""

    messages: list[Message]
    system: str | None = None
    tools: list[ToolSpec] = field(default_factory=list)
    max_output_tokens: int = 4096
    thinking_budget: int | None = None
    cache: bool = False
    """Place prompt-cache breakpoints (system, tools, last message) where the provider has them."""
    assistant_turns: int | None = None
    """Assistant turns in the whole conversation; `messages` may be compacted to fewer."""
    tool_required: bool = False
    """The answer must call one of `tools` (a run with an output gives it by a tool call): sent
    as the provider's `tool_choice` where it has one, and not with Anthropic's extended
    thinking, which refuses it (the loop reminds a model that answered in text instead)."""


@dataclass
class ModelResponse:
    """One assistant message. `usage["input"]` excludes cached tokens."""

    content: list[ContentBlock]
    usage: Usage
    stop_reason: str = "end_turn"


NOT_SENT_CODES = frozenset(
    {"connection_error", "missing_api_key", "spend_cap", "spend_unheld", "script_exhausted"}
)
"""Failures before the provider had the request: nothing it could charge."""


class ProviderError(TetherError):
    """A failed model call. `retryable` marks 429s, 5xx, timeouts and cut streams: the loop
    retries those with a journaled backoff; anything else ends the run with status `error`."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        status: int | None = None,
        code: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.status = status
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after

    @property
    def may_have_charged(self) -> bool:
        """Whether the provider may have charged the call for what it generated: it had the
        request and did not refuse it with an error status (it timed out, its stream broke or
        carried an error)."""
        return self.status in (None, 200) and self.code not in NOT_SENT_CODES


class ContextWindowExceededError(ProviderError):
    """The request does not fit the model's context window (not retryable as is)."""


@runtime_checkable
class Provider(Protocol):
    """A model backend. Implementations must not retry on their own: the loop retries through
    the durable runtime so a replay does not repeat a wait or a paid call."""

    name: str
    model: str
    pricing: Pricing | None
    context_window: int

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse: ...


@dataclass(frozen=True)
class Fallback:
    """A model that answers when the one before it fails (`create_agent(fallbacks=...)`)."""

    provider: Provider
    max_output_tokens: int | None = None
    """Output tokens of its calls; None: the agent's (`Behavior.max_output_tokens`)."""
