"""The Anthropic Messages API provider, on the official SDK.

The neutral message format is Anthropic-shaped, so requests pass through almost unchanged; the
work here is prompt-cache breakpoints, assembling the streamed answer into neutral blocks and
turning every SDK failure into a `ProviderError` the loop can decide on (retry or give up).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

import httpx2

from .._optional import extra_imports

with extra_imports("tether.providers.anthropic", "anthropic"):
    import anthropic as anthropic_sdk  # aliased: this module's factory is called `anthropic`
    from anthropic.types import (
        InputJSONDelta,
        RawContentBlockDeltaEvent,
        RawContentBlockStartEvent,
        RawMessageDeltaEvent,
        RawMessageStartEvent,
        RawMessageStopEvent,
        RawMessageStreamEvent,
        SignatureDelta,
        TextDelta,
        ThinkingDelta,
    )

from ..messages import ContentBlock, Message, Usage
from ..tools.base import ToolSpec
from .base import (
    ContextWindowExceededError,
    ModelRequest,
    ModelResponse,
    Pricing,
    ProviderError,
    TextCallback,
)
from .http_errors import is_retryable_status, retry_after_seconds, without_key

PROVIDER = "anthropic"
DEFAULT_MODEL = "claude-sonnet-4-5"
DEFAULT_CONTEXT_WINDOW = 200_000


# Statuses worth retrying: rate limits, timeouts, lock conflicts and server-side failures.
# Error types that can arrive inside a 200 stream as an `error` event and are transient.
RETRYABLE_ERROR_TYPES = frozenset({"api_error", "overloaded_error", "rate_limit_error"})
CONTEXT_ERROR_CODES = frozenset({"prompt_too_long", "model_context_window_exceeded"})


# --- pricing ---------------------------------------------------------------------------------

# USD per MTok (input, output) for the Claude 4 family; cache reads cost 0.1x and cache writes
# (5-minute TTL) 1.25x the input price.
_CLAUDE_4_MODEL = re.compile(r"^claude-(opus|sonnet|haiku)-4(?:-(\d{1,2}))?(?:-\d{8})?$")
_SONNET_4 = (3.0, 15.0)
_HAIKU_4 = (1.0, 5.0)
_OPUS_4_0 = (15.0, 75.0)  # claude-opus-4, claude-opus-4-1
_OPUS_4_5 = (5.0, 25.0)  # claude-opus-4-5 and later 4.x


def default_pricing(model: str) -> Pricing | None:
    """The list price of a Claude 4 model, or None for a model this table does not know."""
    match = _CLAUDE_4_MODEL.match(model)
    if match is None:
        return None
    family, minor = match.group(1), int(match.group(2) or 0)
    if family == "sonnet":
        rates = _SONNET_4
    elif family == "haiku":
        rates = _HAIKU_4
    else:
        rates = _OPUS_4_5 if minor >= 5 else _OPUS_4_0
    input_price, output_price = rates
    return Pricing(
        input_per_mtok=input_price,
        output_per_mtok=output_price,
        cache_read_per_mtok=round(input_price * 0.1, 6),
        cache_write_per_mtok=round(input_price * 1.25, 6),
    )


# --- the provider ----------------------------------------------------------------------------


class AnthropicProvider:
    """Claude through the Messages API, streamed. The SDK never retries (`max_retries=0`): the
    agent loop retries through the durable journal, so a replay neither waits nor pays twice."""

    name = PROVIDER

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        pricing: Pricing | None = None,
        context_window: int | None = None,
        timeout: float = 600,
    ) -> None:
        key = api_key or os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            raise ProviderError(
                "no Anthropic API key: pass api_key=... or set the ANTHROPIC_API_KEY "
                "environment variable",
                provider=PROVIDER,
                code="missing_api_key",
            )
        self.model = model
        self.pricing = pricing if pricing is not None else default_pricing(model)
        self.context_window = context_window or DEFAULT_CONTEXT_WINDOW
        self._api_key = key
        self._client = anthropic_sdk.AsyncAnthropic(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=0
        )

    def __repr__(self) -> str:
        return f"AnthropicProvider(model={self.model!r})"

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        params = request_params(self.model, request)
        try:
            return await self._stream(params, on_text)
        except anthropic_sdk.APIError as exc:
            error, cause = without_key(self._api_key, error_from_sdk(exc), exc)
            raise error from cause
        except httpx2.TransportError as exc:
            # The SDK wraps transport errors of the initial request, not of the stream body.
            error, cause = without_key(self._api_key, stream_cut_error(exc), exc)
            raise error from cause

    async def _stream(self, params: dict[str, Any], on_text: TextCallback | None) -> ModelResponse:
        assembly = MessageAssembly()
        stream = await self._client.messages.create(**params, stream=True)
        async with stream:
            async for event in stream:
                delta = assembly.add(event)
                if delta and on_text is not None:
                    await on_text(delta)
        if not assembly.finished:
            raise ProviderError(
                "anthropic: the response stream ended before message_stop",
                provider=PROVIDER,
                code="stream_incomplete",
                retryable=True,
            )
        return assembly.response()


def anthropic(
    model: str = DEFAULT_MODEL,
    api_key: str | None = None,
    base_url: str | None = None,
    *,
    pricing: Pricing | None = None,
    context_window: int | None = None,
    timeout: float = 600,
) -> AnthropicProvider:
    """A Claude provider. The key defaults to ANTHROPIC_API_KEY, the base URL to
    ANTHROPIC_BASE_URL or the public API; `pricing` defaults to the list price of known
    models (None for others, which then cost nothing in the run's stats)."""
    return AnthropicProvider(
        model,
        api_key,
        base_url,
        pricing=pricing,
        context_window=context_window,
        timeout=timeout,
    )


# --- request ---------------------------------------------------------------------------------


def request_params(model: str, request: ModelRequest) -> dict[str, Any]:
    """The keyword arguments of `messages.create` for one neutral request (without `stream`)."""
    max_tokens = request.max_output_tokens
    params: dict[str, Any] = {
        "model": model,
        "messages": wire_messages(request.messages, cache=request.cache),
    }
    if request.system:
        params["system"] = wire_system(request.system, cache=request.cache)
    if request.tools:
        params["tools"] = wire_tools(request.tools, cache=request.cache)
    if request.thinking_budget:
        params["thinking"] = {"type": "enabled", "budget_tokens": request.thinking_budget}
        # max_tokens counts thinking too: a budget that fills it would leave no room to answer.
        if max_tokens <= request.thinking_budget:
            max_tokens += request.thinking_budget
        # No temperature is sent: extended thinking only accepts the default of 1.
    elif request.tool_required and request.tools:
        params["tool_choice"] = {"type": "any"}  # refused with thinking on
    params["max_tokens"] = max_tokens
    return params


def wire_system(system: str, *, cache: bool) -> str | list[dict[str, Any]]:
    if not cache:
        return system
    return [{"type": "text", "text": system, "cache_control": _ephemeral()}]


def wire_tools(tools: list[ToolSpec], *, cache: bool) -> list[dict[str, Any]]:
    wire = [
        {"name": t.name, "description": t.description, "input_schema": t.input_schema}
        for t in tools
    ]
    if cache:
        wire[-1]["cache_control"] = _ephemeral()  # caches every tool definition before it too
    return wire


def wire_messages(messages: list[Message], *, cache: bool) -> list[dict[str, Any]]:
    """Copies of the messages (the originals are journaled and must not change), minus
    thinking blocks without a signature, which the API would reject."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        blocks = [dict(b) for b in message["content"] if _sendable(b)]
        wire.append({"role": message["role"], "content": blocks})
    if cache and wire:
        _mark_last_cacheable_block(wire[-1]["content"])
    return wire


def _ephemeral() -> dict[str, str]:
    return {"type": "ephemeral"}  # a fresh dict each time: no two blocks share one object


def _sendable(block: ContentBlock) -> bool:
    return block["type"] != "thinking" or bool(block.get("signature"))


def _mark_last_cacheable_block(blocks: list[dict[str, Any]]) -> None:
    # Thinking blocks cannot carry cache_control; the breakpoint goes on the last other block.
    for block in reversed(blocks):
        if block["type"] != "thinking":
            block["cache_control"] = _ephemeral()
            return


# --- response --------------------------------------------------------------------------------


@dataclass
class _PartialBlock:
    type: str
    text: str = ""
    signature: str = ""
    tool_id: str = ""
    tool_name: str = ""
    json_parts: list[str] = field(default_factory=list)
    start_input: dict[str, Any] = field(default_factory=dict)


class MessageAssembly:
    """Builds the neutral assistant message from the raw stream events."""

    def __init__(self) -> None:
        self.blocks: dict[int, _PartialBlock] = {}
        self.usage: Usage = {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0}
        self.stop_reason = "end_turn"
        self.finished = False

    def add(self, event: RawMessageStreamEvent) -> str:
        """Folds one event in; returns the text delta it carried ("" if none)."""
        if isinstance(event, RawMessageStartEvent):
            usage = event.message.usage
            self._set_usage(
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_input_tokens,
                usage.cache_creation_input_tokens,
            )
        elif isinstance(event, RawContentBlockStartEvent):
            self.blocks[event.index] = _start_block(event)
        elif isinstance(event, RawContentBlockDeltaEvent):
            return self._add_delta(event)
        elif isinstance(event, RawMessageDeltaEvent):
            if event.delta.stop_reason is not None:
                self.stop_reason = event.delta.stop_reason
            usage_delta = event.usage  # cumulative totals; absent fields keep their value
            self._set_usage(
                usage_delta.input_tokens,
                usage_delta.output_tokens,
                usage_delta.cache_read_input_tokens,
                usage_delta.cache_creation_input_tokens,
            )
        elif isinstance(event, RawMessageStopEvent):
            self.finished = True
        return ""

    def _add_delta(self, event: RawContentBlockDeltaEvent) -> str:
        block = self.blocks.get(event.index)
        if block is None:
            return ""
        delta = event.delta
        if isinstance(delta, TextDelta):
            block.text += delta.text
            return delta.text
        if isinstance(delta, InputJSONDelta):
            block.json_parts.append(delta.partial_json)
        elif isinstance(delta, ThinkingDelta):
            block.text += delta.thinking
        elif isinstance(delta, SignatureDelta):
            block.signature += delta.signature
        return ""

    def _set_usage(
        self,
        input_tokens: int | None,
        output_tokens: int | None,
        cache_read: int | None,
        cache_write: int | None,
    ) -> None:
        if input_tokens is not None:
            self.usage["input"] = input_tokens
        if output_tokens is not None:
            self.usage["output"] = output_tokens
        if cache_read is not None:
            self.usage["cache_read"] = cache_read
        if cache_write is not None:
            self.usage["cache_write"] = cache_write

    def response(self) -> ModelResponse:
        content = [
            block
            for _, partial in sorted(self.blocks.items())
            if (block := _neutral_block(partial)) is not None
        ]
        return ModelResponse(content=content, usage=self.usage.copy(), stop_reason=self.stop_reason)


def _start_block(event: RawContentBlockStartEvent) -> _PartialBlock:
    start = event.content_block
    if start.type == "text":
        return _PartialBlock(type="text", text=start.text)
    if start.type == "thinking":
        return _PartialBlock(type="thinking", text=start.thinking, signature=start.signature)
    if start.type == "tool_use":
        return _PartialBlock(
            type="tool_use",
            tool_id=start.id,
            tool_name=start.name,
            start_input=dict(start.input) if isinstance(start.input, dict) else {},
        )
    # Server tools, redacted thinking...: the neutral format has no place for them.
    return _PartialBlock(type=start.type)


def _neutral_block(partial: _PartialBlock) -> ContentBlock | None:
    if partial.type == "text":
        return {"type": "text", "text": partial.text}
    if partial.type == "thinking":
        if partial.signature:
            return {"type": "thinking", "thinking": partial.text, "signature": partial.signature}
        return {"type": "thinking", "thinking": partial.text}
    if partial.type == "tool_use":
        return {
            "type": "tool_use",
            "id": partial.tool_id,
            "name": partial.tool_name,
            "input": _tool_input(partial),
        }
    return None


def _tool_input(partial: _PartialBlock) -> dict[str, Any]:
    raw = "".join(partial.json_parts)
    if not raw.strip():
        return partial.start_input
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    # The tool gets to report the bad arguments; the run must not crash on them.
    return parsed if isinstance(parsed, dict) else {"_raw_arguments": raw}


# --- errors ----------------------------------------------------------------------------------


def error_from_sdk(exc: anthropic_sdk.APIError) -> ProviderError:
    """Classifies an SDK failure: retryable (the loop backs off and tries again) or final."""
    if isinstance(exc, anthropic_sdk.APIStatusError):
        return _status_error(exc)
    if isinstance(exc, anthropic_sdk.APITimeoutError):
        return ProviderError(
            "anthropic: the request timed out", provider=PROVIDER, code="timeout", retryable=True
        )
    if isinstance(exc, anthropic_sdk.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        return ProviderError(
            f"anthropic: could not reach the API{cause}",
            provider=PROVIDER,
            code="connection_error",
            retryable=True,
        )
    return ProviderError(f"anthropic: {exc.message}", provider=PROVIDER)


def _status_error(exc: anthropic_sdk.APIStatusError) -> ProviderError:
    status = exc.status_code
    error_type = exc.type or "error"
    detail = exc.api_message or exc.message
    code = exc.error_code or error_type
    if status == 200:
        # An `error` event inside a stream that had started fine.
        message = f"anthropic: {error_type} during the response stream: {detail}"
        return ProviderError(
            message,
            provider=PROVIDER,
            code=code,
            retryable=error_type in RETRYABLE_ERROR_TYPES,
        )
    message = f"anthropic HTTP {status} {error_type}: {detail}"
    if _is_context_overflow(status, exc.error_code, detail):
        return ContextWindowExceededError(message, provider=PROVIDER, status=status, code=code)
    return ProviderError(
        message,
        provider=PROVIDER,
        status=status,
        code=code,
        retryable=is_retryable_status(status),
        retry_after=retry_after_seconds(exc.response.headers),
    )


def _is_context_overflow(status: int, error_code: str | None, detail: str) -> bool:
    if status != 400:
        return False
    return error_code in CONTEXT_ERROR_CODES or "prompt is too long" in detail.lower()


def stream_cut_error(exc: httpx2.TransportError) -> ProviderError:
    return ProviderError(
        f"anthropic: the connection broke during the response stream ({exc})",
        provider=PROVIDER,
        code="stream_incomplete",
        retryable=True,
    )
