"""Test providers and tools shared by the loop tests."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tether.durable.memory import memory_runtime
from tether.providers.base import ModelRequest, ModelResponse, ProviderError, TextCallback
from tether.providers.scripted import ScriptedProvider
from tether.tools import ToolContext


class RecordingProvider(ScriptedProvider):
    """A scripted provider that keeps every request it was sent."""

    def __init__(self, responses: Sequence[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(responses, **kwargs)
        self.requests: list[ModelRequest] = []

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        self.requests.append(request)
        return await super().complete(request, on_text)


class FlakyProvider(RecordingProvider):
    """Fails the first `failures` calls with `error`, then plays the script."""

    def __init__(
        self, responses: Sequence[dict[str, Any]], failures: int, error: ProviderError
    ) -> None:
        super().__init__(responses)
        self.failures = failures
        self.error = error
        self.attempts = 0

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise self.error
        return await super().complete(request, on_text)


class BlockingProvider(RecordingProvider):
    """Blocks every call until `release` is set (to abort a run mid-call)."""

    def __init__(self, responses: Sequence[dict[str, Any]]) -> None:
        super().__init__(responses)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        self.entered.set()
        await self.release.wait()
        return await super().complete(request, on_text)


def calls(*names: str, **inputs: dict[str, Any]) -> dict[str, Any]:
    """A scripted response with one tool call per name (inputs by name, default {})."""
    return {"tool_calls": [{"name": n, "input": inputs.get(n, {})} for n in names]}


def results_after(turns: list[Any], index: int) -> dict[str, Any]:
    """The tool results (by call id) in the user turn after assistant turn `index`."""
    return {b["tool_use_id"]: b for b in turns[index + 1].content if b["type"] == "tool_result"}


def tool_context(
    call_id: str = "call_0_0", *, run_id: str = "run", agent: Any = None
) -> ToolContext:
    """The context a tool gets from the loop, for calling a tool's `execute` directly."""
    return ToolContext(
        call_id=call_id,
        turn_id="turn",
        tool_name="tool",
        run_id=run_id,
        session_id=None,
        durable=memory_runtime(),
        signal=asyncio.Event(),
        agent=agent,
    )
