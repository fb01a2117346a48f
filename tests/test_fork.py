"""Forking a session: a new one that starts with the first turns of another, cut after an
answer, and goes on from there while the source stays as it was."""

from __future__ import annotations

import pytest

from tests.helpers import RecordingProvider
from tether import create_agent, tool
from tether.messages import text_of
from tether.session import (
    MemorySessionStore,
    SessionTurn,
    create_session,
    load_session,
    memory_store,
)
from tether.session.fork import FORKED_FROM, ForkError, fork_point, fork_session

SCRIPT = [
    {"tool_calls": [{"name": "look", "input": {"q": "weather"}}]},
    {"text": "Sunny."},
    {"text": "Rain tomorrow."},
    {"text": "Forked answer."},
]


@tool(replay="safe")
async def look(q: str) -> str:
    """Look something up."""
    return f"{q}: fine"


async def two_exchanges() -> tuple[MemorySessionStore, list[SessionTurn]]:
    """A session of 6 turns: a tool-using exchange (4 turns), then a plain one (2)."""
    store = memory_store()
    session = await create_session(id="s1", store=store)
    for prompt in ("weather?", "and tomorrow?"):
        agent = create_agent(provider=RecordingProvider(SCRIPT), tools=[look], session=session)
        assert (await agent.run(prompt)).status == "completed"
    assert [t.role for t in session.turns] == ["user", "assistant"] * 3
    return store, session.turns


async def test_a_fork_keeps_whole_exchanges_and_says_where_it_may_end() -> None:
    _, turns = await two_exchanges()
    assert fork_point(turns, "s1", 4) == 4
    assert fork_point(turns, "s1", None) == 6
    with pytest.raises(ForkError, match=r"turn 2 of session 's1' is not an answer.*turns: 4, 6"):
        fork_point(turns, "s1", 2)
    with pytest.raises(ForkError, match="has 6 turns, not 7"):
        fork_point(turns, "s1", 7)
    with pytest.raises(ForkError, match="answers at turns: none yet"):
        fork_point(turns[:1], "s1", None)


async def test_a_forked_session_goes_on_from_its_cut_and_the_source_stays() -> None:
    store, turns = await two_exchanges()
    forked = await fork_session("s1", turns, id="s2", store=store, count=4)
    assert forked.metadata[FORKED_FROM] == {"session": "s1", "turns": 4}
    assert [t.id for t in forked.turns] == [t.id for t in turns[:4]]

    provider = RecordingProvider(SCRIPT)
    stats = await create_agent(provider=provider, tools=[look], session=forked).run("what else?")
    assert stats.status == "completed" and stats.text == "Rain tomorrow."
    [request] = provider.requests
    # The model sees the kept exchange and the new prompt, not the exchange after the cut.
    assert [text_of(m["content"]) for m in request.messages if m["role"] == "user"] == [
        "weather?",
        "",
        "what else?",
    ]
    again = await load_session(store, "s2")
    assert again is not None and again.turn_count == 6
    source = await load_session(store, "s1")
    assert source is not None and [t.id for t in source.turns] == [t.id for t in turns]


async def test_a_fork_needs_a_new_session_of_its_own() -> None:
    store, turns = await two_exchanges()
    with pytest.raises(ForkError, match="is the one it forks"):
        await fork_session("s1", turns, id="s1", store=store)
    await fork_session("s1", turns, id="s2", store=store)
    with pytest.raises(ForkError, match="session 's2' exists"):
        await fork_session("s1", turns, id="s2", store=store)
