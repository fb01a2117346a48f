"""Tail compaction: drop the oldest turns so the request fits the context window."""

from __future__ import annotations

import json

from ..messages import ContentBlock, Message, text_block

CHARS_PER_TOKEN = 4
OMITTED_NOTE = "[{n} earlier messages were omitted to fit the context window.]"


def estimate_tokens(value: object) -> int:
    """A cheap, provider-neutral token estimate (about 4 characters a token)."""
    return len(json.dumps(value, separators=(",", ":"))) // CHARS_PER_TOKEN + 1


def compact_tail(messages: list[Message], budget_tokens: int) -> list[Message]:
    """The longest suffix of `messages` that fits `budget_tokens` and starts at a user message.

    A kept user message whose tool results answer dropped tool calls loses those results (the
    provider would reject them as orphans); a note says how many messages were omitted. The last
    user message is always kept, even if it alone is over budget.
    """
    sizes = [estimate_tokens(m["content"]) for m in messages]
    if sum(sizes) <= budget_tokens:
        return messages
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        return messages
    cut = users[-1]
    for i in reversed(users):
        if sum(sizes[i:]) > budget_tokens:
            break
        cut = i
    if cut == 0:
        return messages
    first = messages[cut]
    kept: list[ContentBlock] = [b for b in first["content"] if b["type"] != "tool_result"]
    note = text_block(OMITTED_NOTE.format(n=cut))
    return [{"role": "user", "content": [note, *kept]}, *messages[cut + 1 :]]
