"""The reference example on a real Restate server: a scripted agent as a virtual object.

`CrashAgent/<session>/run` runs the crash-matrix script of `tests/programs/crash_agent.py`
(20+ journaled steps: unsafe and safe tools, a parallel group) on `restate_runtime`. Every tool
body appends `<tool> <call id>` to the file named in the request. With the environment variable
`TETHER_KILL_AFTER_LIVE_STEPS=N` the worker SIGKILLs itself right after its N-th live step has
been journaled (a step boundary); `TETHER_KILL_IN_CALL=<call id>` kills it inside that tool body.

Optional request fields (for the crash matrix): `"models": <path>` appends `model <turn>` to that
file from a `turn:after` hook, which fires only when a model step runs live, so the file counts
the model calls made across worker processes; `"tool_seconds": <float>` makes every tool body
sleep that long after recording its effect (a run slow enough to restart the server in).
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import restate

from tether import Behavior, ToolContext, create_agent, tool
from tether.agent import Hooks
from tether.providers import scripted
from tether.restate import restate_runtime, restate_session_store
from tether.restate.runtime import RestateRuntime
from tether.session import create_session, load_session

SCRIPT: list[dict[str, Any]] = [
    {"text": "start", "tool_calls": [{"name": "charge", "input": {"amount": 1}}]},
    {"tool_calls": [{"name": "lookup", "input": {"key": "a"}}]},
    {
        "tool_calls": [
            {"name": "lookup", "input": {"key": "b"}},
            {"name": "lookup", "input": {"key": "c"}},
            {"name": "notify", "input": {"to": "ops"}},
        ]
    },
    {"tool_calls": [{"name": "charge", "input": {"amount": 2}}]},
    {
        "tool_calls": [
            {"name": "notify", "input": {"to": "dev"}},
            {"name": "notify", "input": {"to": "qa"}},
        ]
    },
    {"tool_calls": [{"name": "lookup", "input": {"key": "d"}}]},
    {"tool_calls": [{"name": "charge", "input": {"amount": 3}}]},
    {"text": "all done"},
]
KILL_AFTER = int(os.environ.get("TETHER_KILL_AFTER_LIVE_STEPS", "0"))
KILL_IN_CALL = os.environ.get("TETHER_KILL_IN_CALL")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def effect(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def build_tools(path: str, seconds: float = 0.0) -> list[Any]:
    async def record(name: str, ctx: ToolContext) -> None:
        effect(path, f"{name} {ctx.call_id}")
        if ctx.call_id == KILL_IN_CALL:
            die()
        if seconds:
            await asyncio.sleep(seconds)

    @tool
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charges a card (a side effect that must not repeat)."""
        await record("charge", ctx)
        return f"charged {amount}"

    @tool(concurrency_safe=True)
    async def notify(to: str, ctx: ToolContext) -> str:
        """Sends a notification (not safe to repeat)."""
        await record("notify", ctx)
        return f"notified {to}"

    @tool(replay="safe", concurrency_safe=True)
    async def lookup(key: str, ctx: ToolContext) -> str:
        """Reads a value (safe to repeat)."""
        await record("lookup", ctx)
        return f"value of {key}"

    return [charge, notify, lookup]


def kill_after_live_steps(durable: RestateRuntime, n: int) -> None:
    """SIGKILL this worker right after its `n`-th live step has been journaled: the runtime
    counts a step (`_finish`) once the server has acknowledged its entry, for single steps as
    well as for each member of a concurrent group and for the intent of a guarded group."""
    finish = durable._finish

    def counting(kind: Any, started: Any, value: Any) -> Any:
        result = finish(kind, started, value)
        if started.executed and durable.counters.live.total() >= n:
            die()
        return result

    durable._finish = counting  # type: ignore[method-assign]


def count_model_calls(path: str) -> Hooks:
    """A `turn:after` hook (live model steps only) appending `model <turn>` to `path`."""

    def on_turn(payload: dict[str, Any]) -> None:
        effect(path, f"model {payload['turn']}")

    return Hooks({"turn:after": on_turn})


crash_agent = restate.VirtualObject("CrashAgent")


@crash_agent.handler()
async def run(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    durable = restate_runtime(ctx, id_seed=ctx.key())
    if KILL_AFTER:
        kill_after_live_steps(durable, KILL_AFTER)
    store = durable.stores.session
    assert store is not None
    session = await load_session(store, ctx.key()) or await create_session(
        id=ctx.key(), store=store
    )
    models = req.get("models")
    agent = create_agent(
        provider=scripted(SCRIPT),
        tools=build_tools(str(req["effects"]), float(req.get("tool_seconds", 0.0))),
        durable=durable,
        session=session,
        behavior=Behavior(max_concurrent_tools=4),
        hooks=count_model_calls(str(models)) if models else None,
    )
    stats = await agent.run(prompt=str(req.get("prompt", "run the errands")))
    return {
        "status": stats.status,
        "turns": stats.turns,
        "tool_calls": stats.tool_calls,
        "live": dict(durable.counters.live),
        "replayed": dict(durable.counters.replayed),
    }


@crash_agent.handler(kind="shared")
async def transcript(ctx: restate.ObjectSharedContext) -> list[dict[str, Any]]:
    """The session's turns, read from a shared handler while `run` may be running."""
    session = await load_session(restate_session_store(ctx, read_only=True), ctx.key())  # type: ignore[arg-type]
    return [t.to_json() for t in session.turns] if session else []


app = restate.app([crash_agent])
