"""The OpenAI Chat Completions provider, on the official SDK.

Chat Completions is the dialect every OpenAI-compatible server speaks (vLLM, Ollama, OpenRouter,
LiteLLM...), so this provider works with all of them. It translates the Anthropic-shaped neutral
messages to chat messages and the streamed chunks back to neutral blocks.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from .._optional import extra_imports

with extra_imports("tether.providers.openai", "openai"):
    import openai as openai_sdk  # aliased: this module and its factory are both called `openai`
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from ..messages import (
    ContentBlock,
    ImageBlock,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
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

PROVIDER = "openai"
DEFAULT_MODEL = "gpt-4o"
DEFAULT_CONTEXT_WINDOW = 128_000
# Local servers (Ollama, vLLM without --api-key) need no key, but the SDK insists on one.
KEYLESS_PLACEHOLDER = "unused"
RAW_ARGUMENTS = "_raw_arguments"

STOP_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "length": "max_tokens",
    "content_filter": "refusal",
}


# --- pricing ---------------------------------------------------------------------------------

# USD per MTok: (input, output, cached input). Dated snapshots share their alias' price.
_PRICES = {
    "gpt-4o": (2.5, 10.0, 1.25),
    "gpt-4o-mini": (0.15, 0.6, 0.075),
    "gpt-4.1": (2.0, 8.0, 0.5),
}
_SNAPSHOT_SUFFIX = re.compile(r"-\d{4}-\d{2}-\d{2}$")


def default_pricing(model: str) -> Pricing | None:
    """The list price of a known OpenAI model, or None."""
    rates = _PRICES.get(_SNAPSHOT_SUFFIX.sub("", model))
    if rates is None:
        return None
    input_price, output_price, cached_price = rates
    return Pricing(
        input_per_mtok=input_price,
        output_per_mtok=output_price,
        cache_read_per_mtok=cached_price,
    )


# --- the provider ----------------------------------------------------------------------------


class OpenAIProvider:
    """A Chat Completions model, streamed. The SDK never retries (`max_retries=0`): the agent
    loop retries through the durable journal, so a replay neither waits nor pays twice."""

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
        key = api_key or os.environ.get("OPENAI_API_KEY")
        custom_server = bool(base_url or os.environ.get("OPENAI_BASE_URL"))
        if not key:
            if not custom_server:
                raise ProviderError(
                    "no OpenAI API key: pass api_key=... or set the OPENAI_API_KEY "
                    "environment variable",
                    provider=PROVIDER,
                    code="missing_api_key",
                )
            key = KEYLESS_PLACEHOLDER
        self.model = model
        self.pricing = pricing if pricing is not None else default_pricing(model)
        self.context_window = context_window or DEFAULT_CONTEXT_WINDOW
        # OpenAI's own API rejects `max_tokens` for reasoning models; many compatible servers
        # only know `max_tokens`.
        self._official_api = not custom_server
        self._api_key = key
        self._client = openai_sdk.AsyncOpenAI(
            api_key=key, base_url=base_url, timeout=timeout, max_retries=0
        )

    def __repr__(self) -> str:
        return f"OpenAIProvider(model={self.model!r})"

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        try:
            return await self._stream(request, on_text)
        except openai_sdk.APIError as exc:
            error, cause = without_key(self._api_key, error_from_sdk(exc), exc)
            raise error from cause

    async def _stream(self, request: ModelRequest, on_text: TextCallback | None) -> ModelResponse:
        limit = request.max_output_tokens
        stream = await self._client.chat.completions.create(
            model=self.model,
            messages=chat_messages(request.system, request.messages),
            tools=cast(Any, chat_tools(request.tools)) if request.tools else openai_sdk.omit,
            tool_choice="required" if request.tool_required and request.tools else openai_sdk.omit,
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=limit if self._official_api else openai_sdk.omit,
            max_tokens=openai_sdk.omit if self._official_api else limit,
        )
        assembly = ChunkAssembly()
        async with stream:
            async for chunk in stream:
                delta = assembly.add(chunk)
                if delta and on_text is not None:
                    await on_text(delta)
        if assembly.finish_reason is None:
            raise ProviderError(
                "openai: the response stream ended before a finish_reason",
                provider=PROVIDER,
                code="stream_incomplete",
                retryable=True,
            )
        return assembly.response()


def openai(
    model: str = DEFAULT_MODEL,
    api_key: str | None = None,
    base_url: str | None = None,
    *,
    pricing: Pricing | None = None,
    context_window: int | None = None,
    timeout: float = 600,
) -> OpenAIProvider:
    """A Chat Completions provider for OpenAI or any compatible server (`base_url`, e.g.
    "http://localhost:11434/v1" for Ollama). The key defaults to OPENAI_API_KEY and may be
    left out for a custom server; `pricing` defaults to the list price of known models."""
    return OpenAIProvider(
        model,
        api_key,
        base_url,
        pricing=pricing,
        context_window=context_window,
        timeout=timeout,
    )


# --- request ---------------------------------------------------------------------------------


def chat_tools(tools: list[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            },
        }
        for t in tools
    ]


def chat_messages(system: str | None, messages: list[Message]) -> list[ChatCompletionMessageParam]:
    wire: list[dict[str, Any]] = []
    if system:
        wire.append({"role": "system", "content": system})
    for message in messages:
        if message["role"] == "assistant":
            wire.append(_assistant_message(message["content"]))
        else:
            wire.extend(_user_messages(message["content"]))
    return cast(list[ChatCompletionMessageParam], wire)


def _assistant_message(blocks: list[ContentBlock]) -> dict[str, Any]:
    # Thinking blocks are dropped: Chat Completions has no way to send them back.
    text = "".join(b["text"] for b in blocks if b["type"] == "text")
    calls = [_tool_call(b) for b in blocks if b["type"] == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: ToolUseBlock) -> dict[str, Any]:
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": _arguments_json(block["input"])},
    }


def _arguments_json(tool_input: dict[str, Any]) -> str:
    raw = tool_input.get(RAW_ARGUMENTS)
    if isinstance(raw, str) and len(tool_input) == 1:
        return raw  # send back exactly what the model produced
    return json.dumps(tool_input)


def _user_messages(blocks: list[ContentBlock]) -> list[dict[str, Any]]:
    """Tool results become `tool` messages (in order, right after the assistant's calls, as the
    API requires); the rest of the user content follows as one user message."""
    tool_messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in blocks:
        if block["type"] == "tool_result":
            tool_messages.append(_tool_message(block))
            parts.extend(_tool_result_images(block))
        elif block["type"] == "text":
            parts.append({"type": "text", "text": block["text"]})
        elif block["type"] == "image":
            parts.append(_image_part(block))
    if not parts:
        return tool_messages
    return [*tool_messages, {"role": "user", "content": _user_content(parts)}]


def _tool_message(block: ToolResultBlock) -> dict[str, Any]:
    content = block["content"]
    if not isinstance(content, str):
        content = "\n".join(part["text"] for part in content if part["type"] == "text")
    if block.get("is_error"):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}


def _tool_result_images(block: ToolResultBlock) -> list[dict[str, Any]]:
    # Tool messages carry text only, so a tool's images travel in the user message after them.
    content = block["content"]
    if isinstance(content, str):
        return []
    images = [_image_part(part) for part in content if part["type"] == "image"]
    if not images:
        return []
    label = {"type": "text", "text": f"Images returned by tool call {block['tool_use_id']}:"}
    return [label, *images]


def _image_part(block: ImageBlock) -> dict[str, Any]:
    source = block["source"]
    url = f"data:{source['media_type']};base64,{source['data']}"
    return {"type": "image_url", "image_url": {"url": url}}


def _user_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    # A lone text part goes as a plain string, the form every compatible server accepts.
    if len(parts) == 1 and parts[0]["type"] == "text":
        return cast(str, parts[0]["text"])
    return parts


# --- response --------------------------------------------------------------------------------


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    argument_parts: list[str] = field(default_factory=list)


class ChunkAssembly:
    """Builds the neutral assistant message from streamed chunks."""

    def __init__(self) -> None:
        self.text_parts: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.finish_reason: str | None = None
        self.usage: CompletionUsage | None = None

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Folds one chunk in; returns the text delta it carried ("" if none)."""
        if chunk.usage is not None:
            self.usage = chunk.usage
        text = ""
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            if choice.delta.content:
                text += choice.delta.content
            for call in choice.delta.tool_calls or []:
                partial = self.calls.setdefault(call.index, _PartialCall())
                partial.id = partial.id or call.id or ""
                if call.function is not None:
                    partial.name += call.function.name or ""
                    partial.argument_parts.append(call.function.arguments or "")
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        if text:
            self.text_parts.append(text)
        return text

    def response(self) -> ModelResponse:
        content: list[ContentBlock] = []
        text = "".join(self.text_parts)
        if text:
            content.append(TextBlock(type="text", text=text))
        content.extend(_tool_use(partial) for _, partial in sorted(self.calls.items()))
        return ModelResponse(content=content, usage=self._usage(), stop_reason=self._stop_reason())

    def _stop_reason(self) -> str:
        # Some servers (older Ollama) report "stop" even when the answer is tool calls.
        if self.calls:
            return "tool_use"
        reason = self.finish_reason or "stop"
        return STOP_REASONS.get(reason, reason)

    def _usage(self) -> Usage:
        if self.usage is None:  # a server that ignores stream_options.include_usage
            return {"input": 0, "output": 0}
        details = self.usage.prompt_tokens_details
        cached = (details.cached_tokens if details else None) or 0
        return {
            "input": self.usage.prompt_tokens - cached,
            "output": self.usage.completion_tokens,
            "cache_read": cached,
        }


def _tool_use(partial: _PartialCall) -> ToolUseBlock:
    return {
        "type": "tool_use",
        # Some compatible servers leave the id out; the loop needs one to pair the result.
        "id": partial.id or f"call_{uuid.uuid4().hex[:24]}",
        "name": partial.name,
        "input": parse_arguments("".join(partial.argument_parts)),
    }


def parse_arguments(raw: str) -> dict[str, Any]:
    """The tool input; arguments that are not a JSON object are kept raw for the tool to
    report instead of crashing the run."""
    if not raw.strip():
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        parsed = None
    return parsed if isinstance(parsed, dict) else {RAW_ARGUMENTS: raw}


# --- errors ----------------------------------------------------------------------------------


def error_from_sdk(exc: openai_sdk.APIError) -> ProviderError:
    """Classifies an SDK failure: retryable (the loop backs off and tries again) or final."""
    if isinstance(exc, openai_sdk.APIStatusError):
        return _status_error(exc)
    if isinstance(exc, openai_sdk.APITimeoutError):
        return ProviderError(
            "openai: the request timed out", provider=PROVIDER, code="timeout", retryable=True
        )
    if isinstance(exc, openai_sdk.APIConnectionError):
        cause = f" ({exc.__cause__})" if exc.__cause__ else ""
        return ProviderError(
            f"openai: the connection failed{cause}",
            provider=PROVIDER,
            code="connection_error",
            retryable=True,
        )
    if isinstance(exc, openai_sdk.APIResponseValidationError):
        return ProviderError(f"openai: {exc.message}", provider=PROVIDER)
    return _stream_error(exc)


def _status_error(exc: openai_sdk.APIStatusError) -> ProviderError:
    status = exc.status_code
    detail = _api_message(exc)
    code = exc.code or exc.type
    message = f"openai HTTP {status}{f' {code}' if code else ''}: {detail}"
    if status in (400, 413, 422) and _is_context_overflow(exc.code, detail):
        return ContextWindowExceededError(message, provider=PROVIDER, status=status, code=code)
    return ProviderError(
        message,
        provider=PROVIDER,
        status=status,
        code=code,
        retryable=is_retryable_status(status),
        retry_after=retry_after_seconds(exc.response.headers),
    )


def _stream_error(exc: openai_sdk.APIError) -> ProviderError:
    """An error object sent inside a stream that had started fine."""
    detail = exc.message
    code = exc.code or exc.type
    message = f"openai: error during the response stream: {detail}"
    if _is_context_overflow(exc.code, detail):
        return ContextWindowExceededError(message, provider=PROVIDER, code=code)
    retryable = exc.type not in ("invalid_request_error", "authentication_error")
    return ProviderError(message, provider=PROVIDER, code=code, retryable=retryable)


def _api_message(exc: openai_sdk.APIStatusError) -> str:
    body = exc.body  # the SDK unwraps {"error": {...}} to the inner object
    if isinstance(body, Mapping) and isinstance(body.get("message"), str):
        return cast(str, body["message"])
    if isinstance(body, str) and body:
        return body
    return exc.message


def _is_context_overflow(code: str | None, detail: str) -> bool:
    # vLLM and OpenRouter send no code, only OpenAI's wording.
    return code == "context_length_exceeded" or "maximum context length" in detail.lower()
