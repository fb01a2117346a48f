"""A stand-in for many agent workers in one process, for the operator tests and benchmark.

Restate reaches the version `<hash>` of agent `<agent>` in `<namespace>` at
`http://127.0.0.1:<port>/<namespace>/<agent>/<hash>` (the operator's URL template in the tests).
The Restate SDK routes by path suffix, so one ASGI app serves every agent: each gets a virtual
object named after it with the real worker's protocol: `run` (`{"prompt": str}`) and a shared
`pending` that lists the calls parked in the `tether:parked` state. A prompt starting with
`park` parks the run on an awakeable (recorded like the real worker does) until it is resolved;
`busy:<seconds>` keeps it running (in a step) that long.
`run` answers which version served it, so a test can tell old from new. The agent's sidecar
(`<hash>` is `sidecar`) serves stand-ins of its index and live objects.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

import restate

PARKED_STATE_KEY = "tether:parked"
_version: contextvars.ContextVar[str] = contextvars.ContextVar("version", default="")


def _serving_version() -> str:
    return _version.get()


def _now() -> float:
    return time.time()


async def _busy(seconds: float) -> None:
    await asyncio.sleep(seconds)


def _agent_object(agent: str) -> restate.VirtualObject:
    obj = restate.VirtualObject(agent)

    @obj.handler()
    async def run(ctx: restate.ObjectContext, request: dict[str, Any]) -> dict[str, Any]:
        version = await ctx.run_typed("version", _serving_version)
        prompt = str(request.get("prompt") or "")
        answer: Any = None
        if prompt.startswith("park"):
            awakeable_id, decision = ctx.awakeable(type_hint=str)
            created = await ctx.run_typed("clock", _now)
            parked = await ctx.get(PARKED_STATE_KEY) or {}
            parked[awakeable_id] = {
                "awakeable_id": awakeable_id,
                "kind": "ask_human",
                "agent": agent,
                "session": ctx.key(),
                "tool": "ask",
                "call_id": "call-1",
                "input_summary": prompt,
                "created_at": created * 1000,
            }
            ctx.set(PARKED_STATE_KEY, parked)
            answer = await decision
            parked.pop(awakeable_id, None)
            ctx.set(PARKED_STATE_KEY, parked)
        elif prompt.startswith("busy:"):
            await ctx.run_typed("busy", _busy, seconds=float(prompt.removeprefix("busy:")))
        return {"agent": agent, "version": version, "prompt": prompt, "answer": answer}

    @obj.handler(kind="shared")
    async def pending(ctx: restate.ObjectSharedContext) -> list[dict[str, Any]]:
        parked: dict[str, Any] = await ctx.get(PARKED_STATE_KEY) or {}
        return list(parked.values())

    return obj


def _sidecar_objects(agent: str) -> list[restate.VirtualObject]:
    """`<agent>-parked` and `<agent>-live`, with nothing in them: the names are what matters."""
    parked = restate.VirtualObject(f"{agent}-parked")
    live = restate.VirtualObject(f"{agent}-live")

    @parked.handler(kind="shared")
    async def calls(ctx: restate.ObjectSharedContext, token: dict[str, Any]) -> list[Any]:
        return []

    @live.handler()
    async def push(ctx: restate.ObjectContext, batch: dict[str, Any]) -> None:
        return None

    return [parked, live]


_apps: dict[tuple[str, bool], Any] = {}


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    parts = [p for p in str(scope["path"]).split("/") if p]
    if len(parts) < 4:  # <namespace>/<agent>/<hash>/<discover|invoke|health...>
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"no such agent"})
        return
    agent, version = parts[1], parts[2]
    key = (agent, version == "sidecar")
    if key not in _apps:
        services = _sidecar_objects(agent) if key[1] else [_agent_object(agent)]
        _apps[key] = restate.app(services=services)
    token = _version.set(version)
    try:
        await _apps[key](scope, receive, send)
    finally:
        _version.reset(token)
