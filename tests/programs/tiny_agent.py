"""The smallest real use of the library as `pip install tether` (no extras) gives it: an agent
with a tool, on the SQLite runtime, with the scripted model, run to completion; run again, it
replays from the journal. Prints one JSON line.

    python tiny_agent.py <runs.db>
"""

from __future__ import annotations

import asyncio
import json
import sys

from tether import Behavior, create_agent, tool
from tether.durable import sqlite_runtime
from tether.providers import scripted
from tether.session import create_session, load_session

SCRIPT = [
    {"text": "checking", "tool_calls": [{"name": "weather", "input": {"city": "Lisbon"}}]},
    {"text": "Lisbon is sunny: walk to Belem."},
]


@tool(replay="safe")
async def weather(city: str) -> str:
    """The current weather in a city."""
    return f"sunny in {city}"


async def run(db: str) -> dict[str, object]:
    with sqlite_runtime(db, run_id="trip-1") as durable:
        store = durable.stores.session
        assert store is not None
        session = await load_session(store, "trip") or await create_session(id="trip", store=store)
        agent = create_agent(
            provider=scripted(SCRIPT),
            tools=[weather],
            durable=durable,
            session=session,
            behavior=Behavior(max_turns=4),
        )
        stats = await agent.run("Plan a day in Lisbon")
        durable.close(stats.status)
        return {
            "status": stats.status,
            "turns": stats.turns,
            "tool_calls": stats.tool_calls,
            "text": stats.text,
            "live": dict(durable.counters.live),
            "replayed": dict(durable.counters.replayed),
        }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(run(sys.argv[1])), sort_keys=True))
