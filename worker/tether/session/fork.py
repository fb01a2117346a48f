"""Forking a session: a new session that starts with the first turns of another, so a
conversation can go on differently from an earlier answer ("ask that again, another way")
while the original stays as it was."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import TetherError
from .session import Session, create_session
from .store import SessionStore
from .types import SessionTurn

FORKED_FROM = "forked_from"
"""The new session's metadata key: `{"session": <source id>, "turns": <turns kept>}`."""


class ForkError(TetherError):
    """A fork that cannot be made: its cut, its source or its target."""


def _is_answer(turn: SessionTurn) -> bool:
    return turn.role == "assistant" and not any(
        block.get("type") == "tool_use" for block in turn.content
    )


def fork_point(turns: Sequence[SessionTurn], source: str, count: int | None) -> int:
    """How many of `turns` a fork keeps: `count`, or all of them (None). A fork keeps whole
    exchanges, so it must end with an answer (an assistant turn without tool calls); otherwise
    a ForkError says where it may."""
    answers = [i + 1 for i, turn in enumerate(turns) if _is_answer(turn)]
    kept = len(turns) if count is None else count
    if kept in answers:
        return kept
    where = ", ".join(str(n) for n in answers[-10:]) or "none yet"
    if count is not None and not 0 < count <= len(turns):
        problem = f"session {source!r} has {len(turns)} turns, not {count}"
    else:
        problem = (
            f"turn {kept} of session {source!r} is not an answer (a fork keeps whole exchanges)"
        )
    raise ForkError(f"{problem}; it may be forked after the answers at turns: {where}")


async def fork_session(
    source_id: str,
    turns: Sequence[SessionTurn],
    *,
    id: str,
    store: SessionStore,
    count: int | None = None,
) -> Session:
    """A new session `id` in `store` that starts with the first `count` of `turns` (the turns
    of session `source_id`; all of them when None), which must end with an answer. The turns
    are copied (ids and times as they were), not its run records; its metadata says where it
    came from (`FORKED_FROM`). Refused when `store` already has a session `id`."""
    if id == source_id:
        raise ForkError(f"a fork needs a session of its own: {id!r} is the one it forks")
    kept = fork_point(turns, source_id, count)
    if await store.load(id) is not None:
        raise ForkError(f"session {id!r} exists: fork into a new session")
    origin: dict[str, Any] = {"session": source_id, "turns": kept}
    session = await create_session(id=id, store=store, metadata={FORKED_FROM: origin})
    await session.append_turns(list(turns[:kept]))
    return session
