"""A raw-SDK Restate service that parks a call the way the worker does (served by hypercorn).

`ParkAgent/<session>/park` writes a `ParkedCall` record into the object's state under
`tether:parked`, parks on an awakeable and returns `{"value": <resolution>}` (or
`{"rejected": <message>}` when the awakeable is rejected), removing the record first. A journaled
step counts the park with the worker's metrics (`tether.programs.metrics`): when the process runs
with `PROMETHEUS_MULTIPROC_DIR`, the count lands in that directory for the sidecar to serve. The
sidecar lists the parked calls from the worker's own index (`tether.programs.worker.parked_index`)
and answers one through it, here too, with the webhook secret from `TETHER_WEBHOOK_SECRET`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import restate

from tether.parked import PARKED_STATE_KEY, ParkedCall
from tether.programs.metrics import agent_hooks
from tether.programs.worker.parked_index import ParkedIndex

AGENT = "ParkAgent"
SECRETS = tuple(
    key.encode()
    for key in (
        os.environ.get("TETHER_WEBHOOK_SECRET"),
        os.environ.get("TETHER_WEBHOOK_SECRET_PREVIOUS"),
    )
    if key
)
agent = restate.VirtualObject(AGENT)
index = ParkedIndex(AGENT, SECRETS)


def count_parked_tool_call(tool: str) -> None:
    """What the worker's `tool:after` hook records for a call (here: one that parked)."""
    hook = agent_hooks(AGENT)["tool:after"]
    hook({"name": tool, "outcome": "parked", "duration_s": 0.0, "is_error": False})


@agent.handler()
async def park(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    """`{"tool": str, "kind": "approval" | "ask_human", "input": any}`: park until resolved."""
    awakeable_id, answer = ctx.awakeable(type_hint=object)
    created_at = await ctx.run_typed("clock", lambda: time.time() * 1000)
    tool = str(req.get("tool", "restart_service"))
    record: ParkedCall = {
        "awakeable_id": awakeable_id,
        "kind": "ask_human" if req.get("kind") == "ask_human" else "approval",
        "agent": AGENT,
        "session": ctx.key(),
        "tool": tool,
        "call_id": f"call-{ctx.key()}",
        "input_summary": json.dumps(req.get("input", {}))[:300],
        "created_at": created_at,
    }
    parked: dict[str, ParkedCall] = await ctx.get(PARKED_STATE_KEY) or {}
    parked[awakeable_id] = record
    ctx.set(PARKED_STATE_KEY, parked)
    index.add(ctx, record)
    await ctx.run_typed("count parked call", count_parked_tool_call, tool=tool)
    try:
        outcome: dict[str, Any] = {"value": await answer}
    except restate.TerminalError as error:
        outcome = {"rejected": error.message}
    remaining: dict[str, ParkedCall] = await ctx.get(PARKED_STATE_KEY) or {}
    remaining.pop(awakeable_id, None)
    ctx.set(PARKED_STATE_KEY, remaining)
    index.remove(ctx, awakeable_id)
    return outcome


app = restate.app(services=[agent, index.object])
