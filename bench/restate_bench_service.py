"""The Restate services of `bench/restate_steps.py` (served with the hypercorn CLI).

- `BenchRaw/<key>/steps` (`n`): the floor, `n` bare `ctx.run_typed` steps with the raw SDK.
- `BenchRaw/<key>/shaped` (`n`): the floor's steps journaled in the shape of ours (`many_runs.py
  --shaped`): the entries a safe tool run journals besides them, and its values' sizes.
- `BenchAgent/<key>/run` (`{"turns": t, "unsafe": false}`): ours, a scripted agent on
  `restate_runtime` whose every turn but the last calls one tool: a model and a tool step per
  turn (and the tool's intent when `unsafe`), the final answer's model step (its time is the
  run's end). `"checkpoint_every_ms": 0` stores each turn before the next model call, as a
  slow model's turns are.
- `BenchRaw/<key>/park` and `BenchAgent/<key>/park`: the same work, then an awakeable. Its id is
  written to the file named in the request (by one journaled step); the handler waits on it.
  Both park handlers have a 1 s inactivity timeout, so the invocation suspends soon after it
  parks, and resolving the awakeable resumes it by replaying the whole journal. Their answer
  says how long the attempt that answered spent in the handler (`handler_ms`): after a resume,
  the replay of the journal the SDK has already received.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import restate

from tether import create_agent, tool
from tether.durable import DurableRuntime
from tether.programs.gc_tuning import settle_heap
from tether.providers import scripted
from tether.restate import restate_runtime
from tether.session import create_session, load_session

PARK_INACTIVITY = timedelta(seconds=1)


@tool(replay="safe")
async def lookup(key: str) -> str:
    """Looks a key up."""
    return f"value of {key}"


@tool
async def record(key: str) -> str:
    """Records a key (replay="unsafe": journaled behind an intent)."""
    return f"recorded {key}"


def script(turns: int, tool_name: str = "lookup") -> list[dict[str, Any]]:
    calls = [
        {"text": f"step {i}", "tool_calls": [{"name": tool_name, "input": {"key": f"k{i}"}}]}
        for i in range(turns - 1)
    ]
    return [*calls, {"text": "done"}]


def publish(path: str, awakeable_id: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{awakeable_id}\n".encode())
    finally:
        os.close(fd)


def since_ms(started: float) -> float:
    """Milliseconds since `started` (not journaled: each attempt measures its own)."""
    return (time.perf_counter() - started) * 1000


async def park_on_awakeable(ctx: restate.ObjectContext, path: str) -> str:
    awakeable_id, resolved = ctx.awakeable(type_hint=str)
    await ctx.run_typed("publish", publish, path=path, awakeable_id=awakeable_id)
    value: str = await resolved
    return value


# The floor ------------------------------------------------------------------------------------

raw = restate.VirtualObject("BenchRaw")


INT: restate.RunOptions[int] = restate.RunOptions(type_hint=int)


async def step_value(i: int) -> int:
    return i


async def raw_steps(ctx: restate.ObjectContext, n: int) -> int:
    total = 0
    for i in range(n):
        total += await ctx.run_typed(f"step {i}", step_value, INT, i=i)
    return total


@raw.handler()
async def steps(ctx: restate.ObjectContext, n: int) -> dict[str, Any]:
    await raw_steps(ctx, n)
    return {"steps": n}


TEXT: restate.RunOptions[str] = restate.RunOptions(type_hint=str)
MODEL_BYTES, TOOL_BYTES, STATE_BYTES = 230, 103, 11_000
"""A scripted run's sizes at 11 turns: a model step's value, a tool step's, and its state (the
head and two sealed segments) at the end; the first checkpoint writes about 1 KB."""


async def text_value(size: int) -> str:
    return "x" * size


@raw.handler()
async def shaped(ctx: restate.ObjectContext, n: int) -> dict[str, Any]:
    """`n` steps as a safe tool run of `(n + 1) / 2` turns journals them (model and tool
    values alternating, of their sizes), with the rest of what it journals: the head read, the
    key listing, the start's clock step, the first checkpoint, and three state values at the
    end."""
    await ctx.get("head", type_hint=str)
    await ctx.state_keys()
    await ctx.run_typed("timestamp", text_value, TEXT, size=17)
    ctx.set("head", "y" * 1_000)
    for i in range(n):
        size = MODEL_BYTES if i % 2 == 0 else TOOL_BYTES
        await ctx.run_typed(f"step {i}", text_value, TEXT, size=size)
    for key in ("head", "turns", "events"):
        ctx.set(key, "z" * (STATE_BYTES // 3))
    return {"steps": n}


@raw.handler(name="park", inactivity_timeout=PARK_INACTIVITY)
async def raw_park(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    n = int(req["steps"])
    await raw_steps(ctx, n)
    value = await park_on_awakeable(ctx, str(req["path"]))
    return {"steps": n, "resolved": value, "handler_ms": since_ms(started)}


# Ours -----------------------------------------------------------------------------------------


async def run_scripted_agent(
    durable: DurableRuntime, key: str, turns: int, unsafe: bool = False
) -> None:
    """A scripted agent's run of `turns` turns on `durable`, in session `key` (made if new)."""
    store = durable.stores.session
    assert store is not None
    with durable.hold_writes():  # as the worker's `run` does
        session = await load_session(store, key) or await create_session(id=key, store=store)
        agent = create_agent(
            provider=scripted(script(turns, "record" if unsafe else "lookup")),
            tools=[lookup, record],
            durable=durable,
            session=session,
            behavior={"max_turns": turns + 1},
        )
        stats = await agent.run("go")
    assert stats.status == "completed", stats


agent_object = restate.VirtualObject("BenchAgent")


async def agent_steps(
    ctx: restate.ObjectContext, turns: int, unsafe: bool = False, **options: Any
) -> dict[str, Any]:
    durable = restate_runtime(ctx, id_seed=ctx.key(), **options)
    await run_scripted_agent(durable, ctx.key(), turns, unsafe)
    return {
        "steps": durable.counters.live.total() + durable.counters.replayed.total(),
        "live": durable.counters.live.total(),
        "replayed": durable.counters.replayed.total(),
    }


@agent_object.handler()
async def run(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    options = {k: req[k] for k in ("checkpoint_every_ms",) if k in req}
    return await agent_steps(ctx, int(req["turns"]), bool(req.get("unsafe")), **options)


@agent_object.handler(name="park", inactivity_timeout=PARK_INACTIVITY)
async def agent_park(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    started = time.perf_counter()
    result = await agent_steps(ctx, int(req["turns"]))
    result["resolved"] = await park_on_awakeable(ctx, str(req["path"]))
    return {**result, "handler_ms": since_ms(started)}


app = restate.app([raw, agent_object])
# As the worker's app does (`tether.programs.worker.asgi`); both sides run in this process.
settle_heap()
