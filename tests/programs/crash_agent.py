"""A scripted agent run of 20+ journaled steps on the SQLite runtime, for the crash matrix.

    python crash_agent.py DB EFFECTS [--kill-after-commits N] [--kill-in-call CALL_ID]

Every tool body appends `<tool> <call id>` to EFFECTS (fsynced) before it returns. With
`--kill-after-commits N` the process SIGKILLs itself right after its N-th SQLite commit (a step
boundary); with `--kill-in-call ID` it SIGKILLs itself inside that call's body, after the
effect is written. Prints the final stats as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from errands import SCRIPT, die, effect, errand_tools

from tether import Behavior, ToolContext, ToolDef, create_agent
from tether._sqlite import Database
from tether.durable import sqlite_runtime
from tether.providers import scripted
from tether.session import create_session, load_session


def build_tools(effects: Path, kill_in_call: str | None) -> list[ToolDef]:
    async def record(name: str, ctx: ToolContext) -> None:
        effect(effects, f"{name} {ctx.call_id}")
        if ctx.call_id == kill_in_call:
            die()

    return errand_tools(record)


def kill_after_commits(n: int) -> None:
    commit = Database.execute_commit
    count = 0

    def counting(self: Database, writes: object = ()) -> None:
        nonlocal count
        commit(self, writes)  # type: ignore[arg-type]
        count += 1
        if count == n:
            die()

    Database.execute_commit = counting  # type: ignore[method-assign]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("effects")
    parser.add_argument("--kill-after-commits", type=int)
    parser.add_argument("--kill-in-call")
    args = parser.parse_args()
    if args.kill_after_commits:
        kill_after_commits(args.kill_after_commits)
    tools = build_tools(Path(args.effects), args.kill_in_call)
    with sqlite_runtime(args.db, "crash-run") as durable:
        store = durable.stores.session
        assert store is not None
        session = await load_session(store, "s") or await create_session(id="s", store=store)
        agent = create_agent(
            provider=scripted(SCRIPT),
            tools=tools,
            durable=durable,
            session=session,
            behavior=Behavior(max_concurrent_tools=4),
        )
        stats = await agent.run("run the errands")
        durable.close(stats.status)
    json.dump(
        {
            "status": stats.status,
            "live": dict(durable.counters.live),
            "replayed": dict(durable.counters.replayed),
        },
        sys.stdout,
    )


if __name__ == "__main__":
    asyncio.run(main())
