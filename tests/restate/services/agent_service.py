"""The reference example on a real Restate server: a scripted agent as a virtual object.

`CrashAgent/<session>/run` runs the crash-matrix script of `tests/programs/crash_agent.py`
(20+ journaled steps: unsafe and safe tools, a parallel group) on `restate_runtime`. Every tool
body appends `<tool> <call id>` to the file named in the request.

With `"matrix": true` in the request the script grows (`MATRIX_SCRIPT`) by an awakeable tool
(`approve`, `restate_awakeable_tool`: its `notify` appends `awakeable <call id> <awakeable id>`
to the effects file inside its journaled step, and the resumer's `{"answer", "id"}` payload
becomes the result) and a spawned child (`spawn`, `restate_spawn_tool` dispatching to
`CrashChild/run`, which runs `CHILD_SCRIPT` through `run_child` with the same unsafe and safe
tools; its effect lines carry the call id `child:<call id>`).

Kill switches (environment variables of the worker process, so they apply to whichever
invocation, parent or child, runs in that worker):

- `TETHER_KILL_AFTER_LIVE_STEPS=N`: SIGKILL right after the N-th live step of this process has
  been journaled (a step boundary). Steps are the runtime's steps (model calls, tool bodies,
  intents, decisions) of every `RestateRuntime` in the process, parent, child and scopes, plus
  the awakeable tool's journaled notify step;
- `TETHER_KILL_IN_CALL=<id>`: SIGKILL inside that tool body, after its effect line is written:
  a parent call id, `child:<call id>` for a child's call, the `approve` call id (inside its
  notify), the `spawn` call id (in `dispatch`, before the child call is made) or
  `<spawn call id>:merged` (in `on_child_merged`: the child's result is journaled, the
  parent's `spawn:complete` step is not).

Optional request fields (for the crash matrix): `"models": <path>` appends `model <turn>` to that
file from a `turn:after` hook, which fires only when a model step runs live (a child appends
`model child:<turn>` from its provider), so the file counts the model calls made across worker
processes; `"steps": <path>` appends `<label> enter` at each attempt of a handler,
`<label> start <kind> <entry>` when a step's body starts and `<label> live|replayed <kind>
<entry>` when its result is journaled (`live`: the body ran in this attempt; `label` is `parent`
or `child`);
`"tool_seconds": <float>` makes every tool body sleep that long after recording its effect (a
run slow enough to restart the server in); `"tool_gate": {"path": <path>, "calls": [<id>...]}`
makes the bodies of those calls wait, after recording their effect, until that file exists;
with `"kill": <pid>` that process (the restate-server) is stopped (SIGSTOP) before the calls'
journal entries are created and killed (SIGKILL) by their bodies, so it never reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import restate
from restate import RunOptions
from restate.serde import BytesSerde

from tether import Behavior, ToolContext, ToolDef, create_agent
from tether.agent import Hooks
from tether.providers import scripted
from tether.providers.base import ModelRequest, ModelResponse, TextCallback
from tether.providers.scripted import ScriptedProvider
from tether.restate import (
    ChildRunRequest,
    MergedChild,
    RestateAwakeableToolOptions,
    RestateSpawnToolOptions,
    restate_awakeable_tool,
    restate_runtime,
    restate_session_store,
    restate_spawn_tool,
    run_child,
)
from tether.restate.events import read_events
from tether.restate.runtime import DEFAULT_RUN_OPTIONS, RestateRuntime
from tether.session import create_session, load_session
from tether.session.events import Cursor

# The errands (script, tools) are shared with the SQLite crash matrix's program.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "programs"))
from errands import SCRIPT, die, effect, errand_tools

#: The crash matrix's script: `SCRIPT` with an awakeable call before an unsafe one in one turn
#: (the 4th), and a safe call next to a spawned child in another (the 6th).
APPROVE = {"name": "approve", "input": {"what": "release v3"}}
SPAWN = {"name": "spawn", "input": {"task": "settle the invoices"}}
MATRIX_SCRIPT: list[dict[str, Any]] = [
    *SCRIPT[:3],
    {"tool_calls": [APPROVE, *SCRIPT[3]["tool_calls"]]},
    SCRIPT[4],
    {"tool_calls": [*SCRIPT[5]["tool_calls"], SPAWN]},
    *SCRIPT[6:],
]

#: The spawned child's script: an unsafe call alone, then a safe and an unsafe call together.
CHILD_SCRIPT: list[dict[str, Any]] = [
    {"text": "child start", "tool_calls": [{"name": "charge", "input": {"amount": 10}}]},
    {
        "tool_calls": [
            {"name": "lookup", "input": {"key": "invoices"}},
            {"name": "notify", "input": {"to": "billing"}},
        ]
    },
    {"text": "invoices settled"},
]

CHILD_PREFIX = "child:"
KILL_AFTER = int(os.environ.get("TETHER_KILL_AFTER_LIVE_STEPS", "0"))
KILL_IN_CALL = os.environ.get("TETHER_KILL_IN_CALL")


# Step boundaries ------------------------------------------------------------------------------

#: Invocation id -> (steps file, label) of the handlers running in this process.
WATCHED: dict[str, tuple[str, str]] = {}
#: Live steps journaled by this process, across invocations (the kill counter).
LIVE_STEPS = 0
#: Invocation id -> (server pid, step entries) to stop the server before (`tool_gate.kill`).
FREEZE_BEFORE: dict[str, tuple[int, set[str]]] = {}


def signal_server(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # gone since an earlier kill
        os.kill(pid, signum)


def watch(ctx: restate.Context | restate.ObjectContext, path: object, label: str) -> None:
    """Log this attempt's steps to `path` (when given) under `label`."""
    if path:
        WATCHED[str(ctx.request().id)] = (str(path), label)
        effect(str(path), f"{label} enter")


def log_step(invocation_id: str, line: str) -> None:
    watched = WATCHED.get(invocation_id)
    if watched is not None:
        path, label = watched
        effect(path, f"{label} {line}")


def body_starts(invocation_id: str, kind: str, entry: str) -> None:
    """A step's body starts running (its result is not in the journal this attempt sees)."""
    log_step(invocation_id, f"start {kind} {entry}")


def boundary(invocation_id: str, executed: bool, kind: str, entry: str) -> None:
    """A step's result is journaled (`executed`: its body ran in this attempt). Logged,
    counted, and the kill point of `TETHER_KILL_AFTER_LIVE_STEPS`."""
    global LIVE_STEPS
    log_step(invocation_id, f"{'live' if executed else 'replayed'} {kind} {entry}")
    if executed:
        LIVE_STEPS += 1
        if LIVE_STEPS == KILL_AFTER:
            die()


def count_runtime_steps() -> None:
    """Report every `RestateRuntime` step: `_start` names the step and reports its body when it
    runs (`body_starts`); `_finish` runs once the entry's result is acknowledged by the server
    (for single steps as well as for each member of a concurrent group and for the intent of a
    guarded group), in journal order (`boundary`)."""
    start, finish = RestateRuntime._start, RestateRuntime._finish

    def named_start(self: RestateRuntime, kind: Any, name: str, fn: Any) -> Any:
        entry = f"{self._scope}/{name}" if self._scope else name

        async def reported() -> Any:
            body_starts(self.run_id, str(kind), entry)
            return await fn()

        freeze = FREEZE_BEFORE.get(self.run_id)
        if freeze is not None and entry in freeze[1]:
            signal_server(freeze[0], signal.SIGSTOP)
        started = start(self, kind, name, reported)
        started.entry = entry  # type: ignore[attr-defined]
        return started

    def counted_finish(self: RestateRuntime, kind: Any, started: Any, value: Any) -> Any:
        result = finish(self, kind, started, value)
        boundary(self.run_id, started.executed, str(kind), getattr(started, "entry", "?"))
        return result

    RestateRuntime._start = named_start  # type: ignore[method-assign]
    RestateRuntime._finish = counted_finish  # type: ignore[method-assign]


count_runtime_steps()


def given(**options: Any) -> dict[str, Any]:
    """The options that were given (None leaves the SDK's default in place)."""
    return {k: v for k, v in options.items() if v is not None}


class CountedContext:
    """A Restate context whose `run_typed` steps report to `body_starts` and `boundary` (the
    awakeable tool journals its notify step on the context itself, outside the runtime)."""

    def __init__(self, ctx: restate.ObjectContext) -> None:
        self._ctx = ctx
        self._invocation = str(ctx.request().id)

    def run_typed(self, name: str, action: Any, options: Any = None, /) -> Any:
        if name == "timestamp":  # a clock read (`journaled_time`), not a step
            return self._ctx.run_typed(name, action, options or RunOptions())
        ran = False

        async def counted() -> Any:
            nonlocal ran
            ran = True
            body_starts(self._invocation, "run", name)
            value = action()
            return await value if inspect.isawaitable(value) else value

        future = self._ctx.run_typed(name, counted, options or RunOptions())

        async def journaled() -> Any:
            value = await future
            boundary(self._invocation, ran, "run", name)
            return value

        return journaled()

    def sleep(self, delta: timedelta, name: str | None = None) -> Any:
        return self._ctx.sleep(delta, name=name)

    def awakeable(self, serde: Any = None, type_hint: Any = None) -> tuple[str, Any]:
        return self._ctx.awakeable(**given(serde=serde, type_hint=type_hint))

    def resolve_awakeable(self, name: str, value: Any, serde: Any = None) -> None:
        self._ctx.resolve_awakeable(name, value, **given(serde=serde))

    def reject_awakeable(self, name: str, failure_message: str, failure_code: int = 500) -> None:
        self._ctx.reject_awakeable(name, failure_message, failure_code)

    def time(self) -> Any:
        return self._ctx.time()

    def uuid(self) -> Any:
        return self._ctx.uuid()

    def request(self) -> Any:
        return self._ctx.request()


# Tools ----------------------------------------------------------------------------------------


def wait_for_file(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.02)


def build_tools(
    path: str, seconds: float = 0.0, prefix: str = "", gate: dict[str, Any] | None = None
) -> list[ToolDef]:
    held = set(gate["calls"]) if gate else set()

    async def record(name: str, ctx: ToolContext) -> None:
        call = f"{prefix}{ctx.call_id}"
        effect(path, f"{name} {call}")
        if call == KILL_IN_CALL:
            die()
        if call in held and gate.get("kill"):  # type: ignore[union-attr]
            signal_server(int(gate["kill"]), signal.SIGKILL)  # type: ignore[index]
        if seconds:
            await asyncio.sleep(seconds)
        if call in held:
            await asyncio.to_thread(wait_for_file, gate["path"])  # type: ignore[index]

    return errand_tools(record)


def approve_tool(ctx: restate.ObjectContext, path: str, seconds: float) -> ToolDef:
    """`approve`: parks on an awakeable; the resumer posts `{"answer": ..., "id": <its id>}`."""

    async def notify(awakeable_id: str, arguments: dict[str, Any], tool_ctx: ToolContext) -> None:
        effect(path, f"awakeable {tool_ctx.call_id} {awakeable_id}")
        if tool_ctx.call_id == KILL_IN_CALL:
            die()
        if seconds:
            await asyncio.sleep(seconds)

    def to_result(value: Any, arguments: dict[str, Any]) -> str:
        return f"{arguments['what']}: {value['answer']} ({value['id']})"

    return restate_awakeable_tool(
        RestateAwakeableToolOptions(
            name="approve",
            description="Asks a human to approve something; returns their answer.",
            input_schema={"type": "object", "properties": {"what": {"type": "string"}}},
            notify=notify,
            to_result=to_result,
        ),
        ctx=CountedContext(ctx),
    )


def spawn_tool(
    ctx: restate.ObjectContext, req: dict[str, Any], merged: list[MergedChild]
) -> ToolDef:
    """`spawn`: one `CrashChild/run` invocation per task, handed the request's files."""
    files = {k: req[k] for k in ("effects", "models", "steps", "tool_seconds") if k in req}

    def dispatch(request: ChildRunRequest, tool_ctx: ToolContext) -> Any:
        if tool_ctx.call_id == KILL_IN_CALL:
            die()
        return ctx.service_call(child_run, {**request, **files})

    def on_merged(node: MergedChild, tool_ctx: ToolContext) -> None:
        merged.append(node)
        if f"{tool_ctx.call_id}:merged" == KILL_IN_CALL:
            die()

    return restate_spawn_tool(RestateSpawnToolOptions(dispatch=dispatch, on_child_merged=on_merged))


def count_model_calls(path: str) -> Hooks:
    """A `turn:after` hook (live model steps only) appending `model <turn>` to `path`."""

    def on_turn(payload: dict[str, Any]) -> None:
        effect(path, f"model {payload['turn']}")

    return Hooks({"turn:after": on_turn})


class CountingProvider(ScriptedProvider):
    """The child's scripted provider; every call appends `model child:<turn>` to `path`
    (a model call runs only inside a live model step)."""

    def __init__(self, responses: list[dict[str, Any]], path: str | None) -> None:
        super().__init__(responses)
        self.path = path

    async def complete(
        self, request: ModelRequest, on_text: TextCallback | None = None
    ) -> ModelResponse:
        response = await super().complete(request, on_text)
        if self.path:
            effect(self.path, f"model {CHILD_PREFIX}{request.assistant_turns}")
        return response


# Services -------------------------------------------------------------------------------------

crash_agent = restate.VirtualObject("CrashAgent")


@crash_agent.handler()
async def run(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    watch(ctx, req.get("steps"), "parent")
    durable = restate_runtime(ctx, id_seed=ctx.key())
    store = durable.stores.session
    assert store is not None
    session = await load_session(store, ctx.key()) or await create_session(
        id=ctx.key(), store=store
    )
    effects, seconds = str(req["effects"]), float(req.get("tool_seconds", 0.0))
    gate = req.get("tool_gate")
    if gate and gate.get("kill"):
        steps = {f"tool:{call}" for call in gate["calls"]}
        FREEZE_BEFORE[str(ctx.request().id)] = (int(gate["kill"]), steps)
    tools = build_tools(effects, seconds, gate=gate)
    merged: list[MergedChild] = []
    matrix = bool(req.get("matrix"))
    if matrix:
        tools += [approve_tool(ctx, effects, seconds), spawn_tool(ctx, req, merged)]
    models = req.get("models")
    agent = create_agent(
        provider=scripted(MATRIX_SCRIPT if matrix else SCRIPT),
        tools=tools,
        durable=durable,
        session=session,
        behavior=Behavior(max_concurrent_tools=4),
        hooks=count_model_calls(str(models)) if models else None,
    )
    stats = await agent.run(prompt=str(req.get("prompt", "run the errands")))

    async def this_attempts_counters() -> dict[str, Any]:
        return {"live": dict(durable.counters.live), "replayed": dict(durable.counters.replayed)}

    # The counters are this attempt's own, and the output must be every attempt's: an attempt
    # cut after journaling it is retried, replays it and fails on any difference (a journal
    # mismatch, retried for ever). Journaled, they are those of the first attempt to get here.
    counted = await ctx.run_typed("counters", this_attempts_counters, DEFAULT_RUN_OPTIONS)
    return {
        "status": stats.status,
        "turns": stats.turns,
        "tool_calls": stats.tool_calls,
        **counted,
        "children": [
            {"label": m["label"], "status": m["status"], "turns": m["turns"]} for m in merged
        ],
    }


@crash_agent.handler(kind="shared")
async def transcript(ctx: restate.ObjectSharedContext) -> list[dict[str, Any]]:
    """The session's turns, read from a shared handler while `run` may be running."""
    session = await load_session(restate_session_store(ctx, read_only=True), ctx.key())  # type: ignore[arg-type]
    return [t.to_json() for t in session.turns] if session else []


@crash_agent.handler(kind="shared", enable_lazy_state=True)
async def stored(ctx: restate.ObjectSharedContext) -> dict[str, Any]:
    """The session's turns and runs and its durable events, read lazily (as the worker's shared
    handlers read them)."""
    session = await load_session(restate_session_store(ctx, read_only=True), ctx.key())  # type: ignore[arg-type]
    return {
        "turns": [t.to_json() for t in session.turns] if session else [],
        "runs": [r.to_json() for r in session.runs] if session else [],
        "events": await read_events(ctx, Cursor(0)),
    }


@crash_agent.handler(name="seed_state")
async def seed_state(ctx: restate.ObjectContext, state: dict[str, str]) -> int:
    """Writes the given values as they are: an object as an older version left it."""
    for key, value in state.items():
        ctx.set(key, value.encode(), serde=BytesSerde())
    return len(state)


crash_child = restate.Service("CrashChild")


@crash_child.handler(name="run")
async def child_run(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    """A spawned child: `CHILD_SCRIPT` through `run_child`, on the request's files."""
    watch(ctx, req.get("steps"), "child")
    models = req.get("models")
    result = await run_child(
        ctx,
        cast(ChildRunRequest, req),
        provider=CountingProvider(CHILD_SCRIPT, str(models) if models else None),
        tools=build_tools(str(req["effects"]), float(req.get("tool_seconds", 0.0)), CHILD_PREFIX),
        behavior=Behavior(max_concurrent_tools=4),
    )
    return dict(result)


app = restate.app([crash_agent, crash_child])
