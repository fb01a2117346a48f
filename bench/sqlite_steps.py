"""Cost per journaled step of the SQLite runtime, as a ratio against a floor measured in the
same run: a bare loop doing one SQLite insert + commit per step with the same settings.

    python bench/sqlite_steps.py [--turns 200] [--repeat 3]

"Ours" is a scripted agent whose every turn calls one tool, on `sqlite_runtime`: per turn a
decision, a model and a tool step, each committed with the session writes it implies. Also
prints the in-memory runtime's steps/s and µs per step (the loop's own cost, no I/O), so a
ratio that moves can be told apart: the disk's sync or the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tether import create_agent, tool
from tether._sqlite import Synchronous
from tether.durable import journal_steps, memory_runtime, sqlite_runtime
from tether.providers import scripted
from tether.session import create_session


@tool(replay="safe")
async def lookup(key: str) -> str:
    """Looks a key up."""
    return f"value of {key}"


def script(turns: int) -> list[dict[str, Any]]:
    steps = [
        {"text": f"step {i}", "tool_calls": [{"name": "lookup", "input": {"key": f"k{i}"}}]}
        for i in range(turns - 1)
    ]
    return [*steps, {"text": "done"}]


async def agent_run(path: Path, turns: int, synchronous: Synchronous) -> tuple[float, int]:
    """Seconds and journaled steps of one agent run on the SQLite runtime."""
    started = time.perf_counter()
    with sqlite_runtime(path, "bench", synchronous=synchronous) as durable:
        assert durable.stores.session is not None
        session = await create_session(id="bench", store=durable.stores.session)
        agent = create_agent(
            provider=scripted(script(turns)),
            tools=[lookup],
            durable=durable,
            session=session,
            behavior={"max_turns": turns + 1},
        )
        stats = await agent.run("go")
        assert stats.status == "completed", stats
        durable.close(stats.status)
    return time.perf_counter() - started, len(journal_steps(path, "bench"))


def floor(path: Path, steps: int, value: str, synchronous: Synchronous) -> float:
    """Seconds for `steps` bare insert + commit round trips with the same pragmas."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute(
        "CREATE TABLE steps (run_id TEXT, scope TEXT, seq INTEGER, kind TEXT, name TEXT, "
        "value TEXT, at REAL, PRIMARY KEY (run_id, scope, seq)) WITHOUT ROWID"
    )
    started = time.perf_counter()
    for seq in range(steps):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO steps VALUES (?, ?, ?, ?, ?, ?, ?)",
            ("bench", "", seq, "model", f"step:{seq}", value, time.time()),
        )
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return elapsed


async def memory_steps_per_second(turns: int) -> float:
    durable = memory_runtime()
    agent = create_agent(
        provider=scripted(script(turns)),
        tools=[lookup],
        durable=durable,
        behavior={"max_turns": turns + 1},
    )
    started = time.perf_counter()
    await agent.run("go")
    elapsed = time.perf_counter() - started
    return durable.counters.live.total() / elapsed


def average_value(path: Path) -> str:
    conn = sqlite3.connect(path)
    (size,) = conn.execute("SELECT AVG(LENGTH(value)) FROM tether_steps").fetchone()
    conn.close()
    return json.dumps({"pad": "x" * max(0, int(size) - 10)})


def measure(turns: int, repeat: int, synchronous: Synchronous) -> dict[str, float]:
    ratios, ours_rates, floor_rates = [], [], []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as directory:
            ours_path = Path(directory) / "ours.db"
            seconds, steps = asyncio.run(agent_run(ours_path, turns, synchronous))
            floor_seconds = floor(
                Path(directory) / "floor.db", steps, average_value(ours_path), synchronous
            )
        ours_rates.append(steps / seconds)
        floor_rates.append(steps / floor_seconds)
        ratios.append(seconds / floor_seconds)
    return {
        "steps": steps,
        "ours_steps_per_s": statistics.median(ours_rates),
        "floor_steps_per_s": statistics.median(floor_rates),
        "ratio": statistics.median(ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"SQLite runtime, {args.turns} turns, median of {args.repeat}")
    for synchronous in ("FULL", "NORMAL"):
        r = measure(args.turns, args.repeat, synchronous)  # type: ignore[arg-type]
        ours, floor_rate = r["ours_steps_per_s"], r["floor_steps_per_s"]
        print(
            f"  synchronous={synchronous:<6} {int(r['steps'])} steps: "
            f"ours {ours:6.0f} steps/s ({1e6 / ours:5.0f} µs), "
            f"floor {floor_rate:6.0f} steps/s ({1e6 / floor_rate:5.0f} µs), "
            f"ratio {r['ratio']:.2f} (goal <= 1.5)"
        )
    rate = statistics.median(
        asyncio.run(memory_steps_per_second(args.turns)) for _ in range(args.repeat)
    )
    print(
        f"in-memory runtime: {rate:.0f} steps/s, {1e6 / rate:.0f} µs per step (the loop's own cost)"
    )


if __name__ == "__main__":
    main()
