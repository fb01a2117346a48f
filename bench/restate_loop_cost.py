"""The Restate runtime's own cost per turn, without a server: only Tether's code between the
SDK's calls, for live turns and for replayed ones (issue 12: what a resume replays, and the part
of a worker's CPU per turn that is ours).

    python bench/restate_loop_cost.py [--turns 100] [--repeat 5] [--instructions] [--unsafe]

A scripted agent of `--turns` turns, one safe tool call each but the last (`--unsafe`: one
unsafe call, journaled behind its intent), on `restate_runtime`
over a stand-in context. Live, the stand-in runs each step, encodes its value with the step's
serde and decodes it again, as the SDK hands a journaled value back; replayed, it hands back the
bytes the live run recorded without running the step. State writes go nowhere and reads find
nothing (a new session). Prints µs per turn, the best of `--repeat`. With `--instructions`,
CPU instructions per turn counted by valgrind's callgrind instead (the difference of runs of 1
and 4 agent runs, so start-up is left out): within ~0.5% from run to run (the journaled times'
digits vary), so the figure to compare across commits on a noisy machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace
from typing import Any

from restate_bench_service import run_scripted_agent

from tether.restate import restate_runtime

CHILD = "TETHER_LOOP_COST_CHILD"


class StandIn:
    """The slice of a Restate object context the runtime uses, answering at once."""

    def __init__(self, journal: list[bytes] | None = None) -> None:
        self.journal = journal
        self.recorded: list[bytes] = []
        self._position = 0

    def key(self) -> str:
        return "session"

    def request(self) -> Any:
        return SimpleNamespace(id="invocation")

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(int=1)

    def run_typed(self, name: str, action: Any, options: Any = None, /, **kwargs: Any) -> Any:
        serde = options.serde
        if self.journal is not None:
            data = self.journal[self._position]
            self._position += 1
            return _ready(serde.deserialize(data))
        return self._run(action, serde)

    async def _run(self, action: Any, serde: Any) -> Any:
        data = serde.serialize(await action())
        self.recorded.append(data)
        return serde.deserialize(data)

    def get(self, key: str, serde: Any = None, type_hint: Any = None) -> Any:
        return _ready(None)

    def set(self, key: str, value: Any, serde: Any = None) -> None:
        pass

    def clear(self, key: str) -> None:
        pass

    async def state_keys(self) -> list[str]:
        return []


async def _ready(value: Any) -> Any:
    return value


async def agent_run(ctx: StandIn, turns: int, unsafe: bool) -> None:
    durable = restate_runtime(ctx, id_seed=ctx.key(), promises=None)
    await run_scripted_agent(durable, ctx.key(), turns, unsafe)


def recorded_journal(turns: int, unsafe: bool) -> list[bytes]:
    ctx = StandIn()
    asyncio.run(agent_run(ctx, turns, unsafe))
    return ctx.recorded


async def runs(count: int, turns: int, unsafe: bool, journal: list[bytes] | None) -> None:
    for _ in range(count):
        await agent_run(StandIn(journal), turns, unsafe)


def microseconds_per_turn(
    turns: int, unsafe: bool, repeat: int, journal: list[bytes] | None
) -> float:
    asyncio.run(runs(2, turns, unsafe, journal))  # warm-up
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        asyncio.run(runs(5, turns, unsafe, journal))
        best = min(best, time.perf_counter() - started)
    return best / (5 * turns) * 1e6


def instructions(mode: str, count: int, turns: int, unsafe: bool) -> int:
    env = {**os.environ, CHILD: f"{mode}:{count}:{turns}:{int(unsafe)}", "PYTHONHASHSEED": "0"}
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    done = subprocess.run(
        [*command, sys.executable, __file__], env=env, capture_output=True, text=True, check=True
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    assert found, done.stderr[-2000:]
    return int(found[1])


def instructions_per_turn(mode: str, turns: int, unsafe: bool) -> float:
    counted = [instructions(mode, count, turns, unsafe) for count in (4, 1)]
    return (counted[0] - counted[1]) / (3 * turns)


def child(spec: str) -> None:
    mode, count, turns, unsafe = spec.split(":")
    journal = recorded_journal(int(turns), unsafe == "1") if mode == "replay" else None
    asyncio.run(runs(int(count), int(turns), unsafe == "1", journal))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--instructions", action="store_true", help="count them (valgrind)")
    parser.add_argument("--unsafe", action="store_true", help="unsafe tool calls")
    args = parser.parse_args()
    kind = "unsafe" if args.unsafe else "safe"
    print(
        f"Tether's own cost per turn on a stand-in Restate context, {args.turns}-turn runs ({kind})"
    )
    for mode in ("live", "replay"):
        if args.instructions:
            counted = instructions_per_turn(mode, args.turns, args.unsafe)
            print(f"  {mode:6}: {counted / 1000:7.1f}k instructions")
        else:
            journal = recorded_journal(args.turns, args.unsafe) if mode == "replay" else None
            cost = microseconds_per_turn(args.turns, args.unsafe, args.repeat, journal)
            print(f"  {mode:6}: {cost:7.1f} µs (best of {args.repeat})")


if __name__ == "__main__":
    if CHILD in os.environ:
        child(os.environ[CHILD])
    else:
        main()
