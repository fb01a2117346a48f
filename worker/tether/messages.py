"""The provider-neutral conversation model.

Messages and content blocks are plain JSON-shaped dicts so that they journal, persist and cross
process boundaries without conversion. The block shapes follow Anthropic's Messages API (the
richest of the wire formats); the OpenAI provider translates to and from them.
"""

from __future__ import annotations

import json
from typing import Any, Literal, NotRequired, TypedDict

JSON = Any
"""A JSON-serialisable value (what a journal entry can hold)."""


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str


class ImageSource(TypedDict):
    type: Literal["base64"]
    media_type: str
    data: str


class ImageBlock(TypedDict):
    type: Literal["image"]
    source: ImageSource


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(TypedDict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock]
    is_error: NotRequired[bool]


class ThinkingBlock(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: NotRequired[str]


ContentBlock = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
Role = Literal["user", "assistant"]


class Message(TypedDict):
    role: Role
    content: list[ContentBlock]


class Usage(TypedDict):
    input: int
    output: int
    cache_read: NotRequired[int]
    cache_write: NotRequired[int]


def text_block(text: str) -> TextBlock:
    return {"type": "text", "text": text}


def user_message(text: str) -> Message:
    return {"role": "user", "content": [text_block(text)]}


def tool_uses(content: list[ContentBlock]) -> list[ToolUseBlock]:
    """The tool calls of an assistant message, in the order the model made them."""
    return [b for b in content if b["type"] == "tool_use"]


def text_of(content: list[ContentBlock]) -> str:
    """The concatenated text blocks of a message."""
    return "".join(b["text"] for b in content if b["type"] == "text")


def tool_result(
    tool_use_id: str, content: str | list[TextBlock | ImageBlock], *, is_error: bool = False
) -> ToolResultBlock:
    block: ToolResultBlock = {"type": "tool_result", "tool_use_id": tool_use_id, "content": content}
    if is_error:
        block["is_error"] = True
    return block


CHARS_PER_TOKEN = 4


def estimate_tokens(value: object) -> int:
    """A cheap, provider-neutral token estimate (about 4 characters a token)."""
    return len(json.dumps(value, separators=(",", ":"))) // CHARS_PER_TOKEN + 1
