"""A budgeted run on the SQLite runtime whose sub-agents spend it, for kills at every commit.

    python budget_agent.py DB [--kill-after-commits N]

The run has $0.65; every model call may cost and costs $0.10 (1,000 output tokens at $100 per
million). It spawns a child that makes four calls, then a second child, which finds no room:
$0.60 is spent by then, and a call could make it $0.70. With
`--kill-after-commits N` the process SIGKILLs itself right after its N-th SQLite commit (steps,
sessions and the ledger's rows commit alike). Prints the stats and the root's ledger as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from crash_agent import kill_after_commits

from tether import Behavior, create_agent, tool
from tether.agent import spawn_tool
from tether.budget import ledger_status
from tether.durable import sqlite_runtime
from tether.providers import Pricing, scripted
from tether.session import create_session, load_session

USAGE = {"input": 20, "output": 1000}
PRICE = Pricing(input_per_mtok=0, output_per_mtok=100)
BUDGET = Behavior(max_cost_usd=0.65, max_output_tokens=1000)


@tool
async def note(text: str) -> str:
    """Write a note."""
    return f"noted {text}"


def spawn(task: str) -> dict[str, object]:
    return {"tool_calls": [{"name": "spawn", "input": {"task": task}}], "usage": USAGE}


NOTE = {"tool_calls": [{"name": "note", "input": {"text": "x"}}], "usage": USAGE}
SCRIPT = {
    "audit": [spawn("first half"), spawn("second half"), {"text": "done", "usage": USAGE}],
    "first half": [NOTE, NOTE, NOTE, {"text": "first ok", "usage": USAGE}],
    "second half": [NOTE, NOTE, NOTE, {"text": "second ok", "usage": USAGE}],
}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("--kill-after-commits", type=int)
    args = parser.parse_args()
    if args.kill_after_commits:
        kill_after_commits(args.kill_after_commits)
    provider = scripted(SCRIPT, pricing=PRICE)
    with sqlite_runtime(args.db, "budget-run") as durable:
        store = durable.stores.session
        assert store is not None
        session = await load_session(store, "s") or await create_session(id="s", store=store)
        agent = create_agent(
            provider=provider,
            tools=[note, spawn_tool(provider=provider, tools=[note], max_depth=1)],
            durable=durable,
            session=session,
            behavior=BUDGET,
        )
        stats = await agent.run("audit")
        durable.close(stats.status)
    json.dump(
        {
            "status": stats.status,
            "cost_usd": stats.total_cost_usd,
            "children": [c.status for c in stats.children],
            "ledger": ledger_status(args.db, str(stats.run_id)),
            "live_model_calls": provider.calls,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    asyncio.run(main())
