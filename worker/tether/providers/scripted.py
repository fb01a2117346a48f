"""A deterministic provider that plays back a script of responses.

The response for a call is chosen by the number of assistant turns already in the conversation,
not by an in-process counter, so a resumed run continues the script where it stopped.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

from ..messages import ContentBlock, Usage
from .base import ModelRequest, ModelResponse, Pricing, ProviderError, TextCallback


class ScriptExhaustedError(ProviderError):
    """The conversation asked for more responses than the script has."""


def _chunks(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text)


class ScriptedProvider:
    """Plays back `responses`: dicts with optional `text`, `tool_calls` ([{name, input}]) and
    `usage` ({input, output})."""

    name = "scripted"

    def __init__(
        self,
        responses: Sequence[dict[str, Any]],
        *,
        model: str = "scripted",
        pricing: Pricing | None = None,
        context_window: int = 200_000,
        delay: float = 0.0,
    ) -> None:
        self.responses = list(responses)
        self.model = model
        self.pricing = pricing
        self.context_window = context_window
        self.delay = delay
        self.calls = 0
        """Calls made in this process (for tests; never used to choose a response)."""

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        index = request.assistant_turns
        if index is None:
            index = sum(1 for m in request.messages if m["role"] == "assistant")
        if index >= len(self.responses):
            raise ScriptExhaustedError(
                f"the script has {len(self.responses)} responses and the conversation asks for "
                f"response {index + 1}; add responses or lower max_turns",
                provider=self.name,
            )
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        response = self.responses[index]
        content: list[ContentBlock] = []
        text = str(response.get("text") or "")
        if text:
            if on_text:
                for chunk in _chunks(text):
                    await on_text(chunk)
            content.append({"type": "text", "text": text})
        for i, call in enumerate(response.get("tool_calls") or []):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"call_{index}_{i}",
                    "name": call["name"],
                    "input": dict(call.get("input") or {}),
                }
            )
        given = response.get("usage") or {}
        usage: Usage = {
            "input": int(given.get("input", 10)),
            "output": int(given.get("output", max(1, len(text) // 4))),
        }
        stop = "tool_use" if response.get("tool_calls") else "end_turn"
        return ModelResponse(content=content, usage=usage, stop_reason=stop)


def scripted(
    responses: Sequence[dict[str, Any]],
    *,
    model: str = "scripted",
    pricing: Pricing | None = None,
    delay: float = 0.0,
) -> ScriptedProvider:
    """A provider that returns `responses` in order (see `ScriptedProvider`)."""
    return ScriptedProvider(responses, model=model, pricing=pricing, delay=delay)
