"""Tail compaction: drop the oldest turns so the request fits the context window."""

from __future__ import annotations

from typing import Any

from ..messages import ContentBlock, Message, estimate_tokens, text_block

OMITTED_NOTE = "[{n} earlier messages were omitted to fit the context window.]"


def compact_tail(messages: list[Message], budget_tokens: int, omitted: int = 0) -> list[Message]:
    """The longest suffix of `messages` that fits `budget_tokens` and starts at a user message.

    A kept user message whose tool results answer dropped tool calls loses those results (the
    provider would reject them as orphans); a note says how many messages were omitted. The last
    user message is always kept, even if it alone is over budget. `omitted`: the messages before
    `messages` that were not loaded (a session read from its end, as `ContextCovered` allows).
    """
    sizes = [estimate_tokens(m["content"]) for m in messages]
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users or (not omitted and sum(sizes) <= budget_tokens):
        return messages
    cut = users[-1]
    for i in reversed(users):
        if sum(sizes[i:]) > budget_tokens:
            break
        cut = i
    if cut + omitted == 0:
        return messages
    first = messages[cut]
    kept: list[ContentBlock] = [b for b in first["content"] if b["type"] != "tool_result"]
    note = text_block(OMITTED_NOTE.format(n=cut + omitted))
    return [{"role": "user", "content": [note, *kept]}, *messages[cut + 1 :]]


class ContextCovered:
    """Whether the newest turns of a session (as JSON, in order) hold all that `compact_tail`
    keeps of the whole session within `budget_tokens`: they are over the budget, so no earlier
    user message can start the kept suffix, and they hold a user message, so the last one is
    among them. The `enough` of a session read from its end (`SessionStore.load`); called with a
    list that grows at its front, it measures each turn once."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        self._measured = 0
        self._tokens = 0
        self._user = False

    def __call__(self, turns: list[dict[str, Any]]) -> bool:
        for turn in turns[: len(turns) - self._measured]:
            self._tokens += estimate_tokens(turn["content"])
            self._user = self._user or turn["role"] == "user"
        self._measured = len(turns)
        return self._user and self._tokens > self.budget_tokens
