"""The session's event stream in process (`Agent.events`, `MemoryEventLog`): what a library user
watching a run on the embedded runtimes sees."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.helpers import RecordingProvider
from tether import create_agent, tool
from tether.durable import sqlite_runtime
from tether.session.events import Cursor, MemoryEventLog


@tool
async def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


SCRIPT = [
    {"tool_calls": [{"name": "add", "input": {"a": 1, "b": 2}}], "usage": {"input": 900}},
    {"text": "three"},
]
DURABLE = [
    "run_started",
    "model_done",
    "budget_warning",
    "tool_finished",
    "model_done",
    "run_ended",
]


async def collect(agent: Any, after: str | None = None) -> list[dict[str, Any]]:
    events = []
    async for event in agent.events(after):
        events.append(event)
        if event["type"] == "run_ended":
            return events
    raise AssertionError("the stream ended")


async def test_a_watcher_sees_the_run_step_by_step_with_live_text() -> None:
    agent = create_agent(
        provider=RecordingProvider(SCRIPT), tools=[add], behavior={"max_tokens": 1000}
    )
    watcher = asyncio.create_task(collect(agent))
    stats = await agent.run("add 1 and 2")
    events = await asyncio.wait_for(watcher, 5)

    assert stats.status == "completed"
    assert [e["type"] for e in events if "." not in e["id"]] == DURABLE
    assert [e["id"] for e in events if "." not in e["id"]] == ["1", "2", "3", "4", "5", "6"]
    kinds = [e["type"] for e in events]
    assert kinds.index("tool_started") < kinds.index("tool_finished")
    assert "model_text" in kinds and kinds.index("model_text") < len(kinds) - 2
    warning = events[kinds.index("budget_warning")]
    assert (warning["budget"], warning["limit"]) == ("tokens", 1000)
    finished = events[kinds.index("tool_finished")]
    assert (finished["tool"], finished["outcome"], finished["is_error"]) == ("add", "ok", False)
    assert [c.durable for c in map(Cursor.parse, (e["id"] for e in events))] == sorted(
        Cursor.parse(e["id"]).durable for e in events
    )

    # A reader that comes back after an event gets only what followed it.
    resumed = await asyncio.wait_for(collect(agent, after=events[2]["cursor"]), 5)
    assert resumed == events[3:]


async def test_a_resumed_sqlite_run_streams_its_replayed_steps_once_in_the_new_process(
    tmp_path: Path,
) -> None:
    database = tmp_path / "runs.db"
    for attempt in range(2):  # the second opens the finished run again: all from the journal
        with sqlite_runtime(database, "r1") as durable:
            agent = create_agent(provider=RecordingProvider(SCRIPT), tools=[add], durable=durable)
            assert isinstance(durable.stores.events, MemoryEventLog)
            await agent.run("add 1 and 2")
            log = durable.stores.events
            assert agent.session is not None
            durable_events = [e for e in log.read(agent.session.id) if "." not in e["id"]]
            kinds = [e["type"] for e in durable_events]
            assert kinds == [k for k in DURABLE if k != "budget_warning"], attempt
