"""A deterministic provider that plays back a script of responses.

The response for a call is chosen by the number of assistant turns already in the conversation,
not by an in-process counter, so a resumed run continues the script where it stopped.

A script is a list of responses, or several lists keyed by prompt (`{prompt: [responses], "*":
[responses]}`): the list is chosen by the text of the conversation's first user message (exact
match, else `"*"`), so one provider can play a parent and its sub-agents, whose first message is
their task.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..messages import ContentBlock, Message, Usage, text_of
from .base import ModelRequest, ModelResponse, Pricing, ProviderError, TextCallback


class ScriptExhaustedError(ProviderError):
    """The conversation asked for more responses than the script has (nothing was sent)."""

    def __init__(self, message: str, *, provider: str) -> None:
        super().__init__(message, provider=provider, code="script_exhausted")


DEFAULT_SCRIPT = "*"
"""The key of the responses for a conversation whose first message matches no other key."""

Response = dict[str, Any]
Script = Sequence[Response] | Mapping[str, Sequence[Response]]
"""A list of responses, or lists keyed by the conversation's first user message."""


_CHUNK = re.compile(r"\S+\s*|\s+")


@functools.lru_cache(maxsize=1024)
def _chunks(text: str) -> tuple[str, ...]:
    # a script plays the same texts in every run: split once
    return tuple(_CHUNK.findall(text))


DEFAULT_CONTEXT_WINDOW = 200_000


def first_prompt(messages: Sequence[Message]) -> str | None:
    """The text of the first user message, None without one."""
    for message in messages:
        if message["role"] == "user":
            return text_of(message["content"])
    return None


def _scripts(responses: Script) -> dict[str, list[Response]]:
    if isinstance(responses, Mapping):
        scripts = {str(key): list(value) for key, value in responses.items()}
        if not scripts:
            raise ValueError("a keyed script needs at least one prompt (or `*`)")
        return scripts
    return {DEFAULT_SCRIPT: list(responses)}


def _shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ScriptedProvider:
    """Plays back `responses`: dicts with optional `text`, `tool_calls` ([{name, input}]) and
    `usage` ({input, output}). `responses` is one list, or a mapping from the text of the
    conversation's first user message to its list, with `"*"` for any other conversation (a
    request whose oldest messages were compacted away is matched by what is left of it)."""

    name = "scripted"

    def __init__(
        self,
        responses: Script,
        *,
        model: str = "scripted",
        pricing: Pricing | None = None,
        context_window: int = DEFAULT_CONTEXT_WINDOW,
        delay: float = 0.0,
    ) -> None:
        self.scripts = _scripts(responses)
        """The response lists by prompt (a plain list is kept under `"*"`)."""
        self.model = model
        self.pricing = pricing
        self.context_window = context_window
        self.delay = delay
        self.calls = 0
        """Calls made in this process (for tests; never used to choose a response)."""

    @property
    def responses(self) -> list[Response]:
        """The responses of a conversation that matches no prompt (the `"*"` list)."""
        return self.scripts.get(DEFAULT_SCRIPT, [])

    def script_for(self, messages: Sequence[Message]) -> tuple[str, list[Response]]:
        """The key and the responses of the conversation of `messages`."""
        prompt = first_prompt(messages)
        if prompt is not None and prompt in self.scripts:
            return prompt, self.scripts[prompt]
        if DEFAULT_SCRIPT in self.scripts:
            return DEFAULT_SCRIPT, self.scripts[DEFAULT_SCRIPT]
        known = ", ".join(repr(_shorten(k)) for k in self.scripts)
        raise ScriptExhaustedError(
            f"no script for the prompt {_shorten(prompt or '')!r}: the script has responses for "
            f"{known}; add this prompt or a `*` entry",
            provider=self.name,
        )

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        key, responses = self.script_for(request.messages)
        index = request.assistant_turns
        if index is None:
            index = sum(1 for m in request.messages if m["role"] == "assistant")
        if index >= len(responses):
            which = "the script" if len(self.scripts) == 1 else f"the script for {key!r}"
            raise ScriptExhaustedError(
                f"{which} has {len(responses)} responses and the conversation asks for "
                f"response {index + 1}; add responses or lower max_turns",
                provider=self.name,
            )
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        response = responses[index]
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
    responses: Script,
    *,
    model: str = "scripted",
    pricing: Pricing | None = None,
    context_window: int | None = None,
    delay: float = 0.0,
) -> ScriptedProvider:
    """A provider that returns `responses` in order, or the list keyed by the conversation's
    first user message (see `ScriptedProvider`)."""
    return ScriptedProvider(
        responses,
        model=model,
        pricing=pricing,
        context_window=context_window or DEFAULT_CONTEXT_WINDOW,
        delay=delay,
    )
