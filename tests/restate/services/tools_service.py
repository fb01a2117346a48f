"""Restate services for the tool tests (served with the hypercorn CLI).

- `ToolsAgent/<key>/run`: a scripted agent on `restate_runtime` whose request picks a scenario:
  - `approve`: one call of an awakeable tool (`restate_awakeable_tool`), optional `timeout_ms`;
  - `deploy_wait` / `deploy_attach`: one call of a `restate_tool` with `durable_start` (awakeable
    wait, or a bounded attach that polls for `<effects>.<token>.done`);
  - `soft`: three single-phase `restate_tool` calls (ValueError, ToolError, success).
  It returns the run's status and every tool result of the transcript.
- `SpawnParent/<key>/run`: a parent agent whose `restate_spawn_tool` dispatches children to
  `SpawnChild/run`, which calls `run_child`; its `spawn:complete` hook appends
  `spawn:complete <call id> <text>` to `effects`. `SpawnParent/<key>/runs` lists the session's
  runs.
- `BackgroundWaiter/wait`: `restate_wait_background` against a fake host registry, a JSON file.

Every side effect appends a line to the `effects` file of the request (`enter` at each attempt
of a handler), so a test can count what ran across killed worker processes.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import restate

from tether import ToolContext, ToolDef, ToolSpec, create_agent
from tether.providers import scripted
from tether.restate import (
    ChildRunRequest,
    MergedChild,
    RestateAwakeableToolOptions,
    RestateDurableStart,
    RestateDurableWait,
    RestateSpawnToolOptions,
    RestateToolOptions,
    RestateWaitBackgroundOptions,
    create_replay_tracker,
    restate_awakeable_tool,
    restate_runtime,
    restate_session_store,
    restate_spawn_tool,
    restate_tool,
    restate_wait_background,
    run_child,
)
from tether.session import create_session, load_session
from tether.tools import ToolError


def effect(path: str, line: str) -> None:
    # O_APPEND with one small write: lines from concurrent or killed processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def tool_results(turns: list[Any]) -> list[dict[str, Any]]:
    return [
        {"id": b["tool_use_id"], "content": b["content"], "is_error": bool(b.get("is_error"))}
        for turn in turns
        for b in turn.content
        if b["type"] == "tool_result"
    ]


# ToolsAgent ---------------------------------------------------------------------------------

INPUT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"what": {"type": "string"}}}


def approve_tool(effects: str, timeout_ms: float | None) -> ToolDef:
    async def notify(awakeable_id: str, arguments: dict[str, Any], ctx: ToolContext) -> None:
        effect(effects, f"notify {ctx.call_id} {awakeable_id}")

    return restate_awakeable_tool(
        RestateAwakeableToolOptions(
            name="approve",
            description="Asks a human to approve something; returns their answer.",
            input_schema=INPUT_SCHEMA,
            notify=notify,
            timeout_ms=timeout_ms,
            to_result=lambda value, arguments: f"{arguments['what']}: {json.dumps(value)}",
        )
    )


async def no_body(arguments: dict[str, Any], ctx: ToolContext) -> str:
    raise AssertionError("a durable_start tool never runs its own execute")


def done_text(path: str) -> str | None:
    """The job's completion note, once the test has written it."""
    try:
        return Path(path).read_text().strip()
    except FileNotFoundError:
        return None


def deploy_tool(ctx: restate.ObjectContext, effects: str, mode: str, tracker: Any) -> ToolDef:
    async def start(arguments: dict[str, Any], tool_ctx: ToolContext) -> str:
        effect(effects, f"start {tool_ctx.call_id}")
        return f"job-{tool_ctx.call_id}"

    async def register(token: str, awakeable_id: str, arguments: Any, tool_ctx: Any) -> None:
        effect(effects, f"register {token} {awakeable_id}")

    async def result(token: str, resumed: Any, arguments: Any, tool_ctx: Any) -> str:
        return f"{token}: {'timed out' if resumed is None else resumed['log']}"

    async def attach(token: str, arguments: Any, tool_ctx: Any) -> str:
        effect(effects, f"attach {token}")
        for _ in range(1200):  # a bounded wait (60 s), as `attach` requires
            done = done_text(f"{effects}.{token}.done")
            if done is not None:
                return f"{token}: {done}"
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{token} did not finish")

    def on_abort(token: str, arguments: Any, tool_ctx: Any) -> None:
        effect(effects, f"abort {token}")

    wait = RestateDurableWait(register=register, result=result, timeout_ms=None)
    durable_start: RestateDurableStart[str, Any] = RestateDurableStart(
        start=start,
        wait=wait if mode == "wait" else None,
        attach=attach if mode == "attach" else None,
        on_abort=on_abort,
    )
    inner = ToolDef(spec=ToolSpec("deploy", "Deploys a version.", INPUT_SCHEMA), execute=no_body)
    return restate_tool(
        inner, ctx, RestateToolOptions(durable_start=durable_start, replay_tracker=tracker)
    )


def soft_tools(ctx: restate.ObjectContext, effects: str) -> list[ToolDef]:
    async def explode(arguments: dict[str, Any], tool_ctx: ToolContext) -> str:
        effect(effects, f"explode {tool_ctx.call_id}")
        raise ValueError("boom")

    async def polite(arguments: dict[str, Any], tool_ctx: ToolContext) -> str:
        effect(effects, f"polite {tool_ctx.call_id}")
        raise ToolError("nope")

    async def fine(arguments: dict[str, Any], tool_ctx: ToolContext) -> str:
        effect(effects, f"fine {tool_ctx.call_id}")
        return "all good"

    def wrap(name: str, execute: Any) -> ToolDef:
        inner = ToolDef(spec=ToolSpec(name, f"The {name} tool.", INPUT_SCHEMA), execute=execute)
        return restate_tool(inner, ctx)

    return [wrap("explode", explode), wrap("polite", polite), wrap("fine", fine)]


def scenario(ctx: restate.ObjectContext, req: dict[str, Any], tracker: Any) -> tuple[Any, Any]:
    """The tools and the script of the request's scenario."""
    effects, name = str(req["effects"]), str(req["scenario"])
    if name == "approve":
        tools = [approve_tool(effects, req.get("timeout_ms"))]
        first = [{"name": "approve", "input": {"what": "release v2"}}]
    elif name in ("deploy_wait", "deploy_attach"):
        tools = [deploy_tool(ctx, effects, name.removeprefix("deploy_"), tracker)]
        first = [{"name": "deploy", "input": {"what": "v2"}}]
    elif name == "soft":
        tools = soft_tools(ctx, effects)
        first = [{"name": n, "input": {}} for n in ("explode", "polite", "fine")]
    else:
        raise restate.TerminalError(f"unknown scenario {name!r}", 400)
    return tools, [{"tool_calls": first}, {"text": "finished"}]


tools_agent = restate.VirtualObject("ToolsAgent")


@tools_agent.handler()
async def run(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    effect(str(req["effects"]), "enter")
    tracker = create_replay_tracker()
    durable = restate_runtime(ctx, id_seed=ctx.key(), replay_tracker=tracker)
    store = durable.stores.session
    assert store is not None
    session = await load_session(store, ctx.key()) or await create_session(
        id=ctx.key(), store=store
    )
    tools, script = scenario(ctx, req, tracker)
    agent = create_agent(provider=scripted(script), tools=tools, durable=durable, session=session)
    stats = await agent.run(prompt="go")
    return {"status": stats.status, "text": stats.text, "results": tool_results(session.turns)}


# Spawn ---------------------------------------------------------------------------------------


def child_script(request: ChildRunRequest) -> list[dict[str, Any]]:
    """`leaf X` answers at once; `fanout X` spawns `deep X` first; `deep X` tries to spawn once
    more (refused: too deep), then answers."""
    kind, _, subject = request["task"].partition(" ")
    label = request["label"]
    if kind == "fanout":
        spawn = {"name": "spawn", "input": {"task": f"deep {subject}"}}
        return [{"tool_calls": [spawn]}, {"text": f"{label} fanned out {subject}"}]
    if kind == "deep":
        spawn = {"name": "spawn", "input": {"task": "leaf too-deep"}}
        return [{"tool_calls": [spawn]}, {"text": f"{label} went deep on {subject}"}]
    return [{"text": f"{label} did {subject}"}]


def spawn_tool(ctx: restate.Context, merged: list[MergedChild] | None = None) -> ToolDef:
    def on_merged(node: MergedChild, tool_ctx: ToolContext) -> None:
        if merged is not None:
            merged.append(node)

    return restate_spawn_tool(
        RestateSpawnToolOptions(
            dispatch=lambda request, tool_ctx: ctx.service_call(child_run, request),
            on_child_merged=on_merged,
        )
    )


spawn_child = restate.Service("SpawnChild")


@spawn_child.handler(name="run")
async def child_run(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    request: ChildRunRequest = req  # type: ignore[assignment]
    result = await run_child(
        ctx, request, provider=scripted(child_script(request)), tools=[spawn_tool(ctx)]
    )
    return dict(result)


PARENT_SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "spawn", "input": {"tasks": ["leaf alpha", "leaf beta"]}}]},
    {"tool_calls": [{"name": "spawn", "input": {"task": "fanout gamma"}}]},
    {"text": "parent done"},
]

spawn_parent = restate.VirtualObject("SpawnParent")


def summary(node: MergedChild) -> dict[str, Any]:
    return {
        "label": node["label"],
        "task": node["task"],
        "depth": node["depth"],
        "status": node["status"],
        "turns": len(node["turns"]),
        "children": [summary(c) for c in node.get("children") or []],
    }


@spawn_parent.handler(name="run")
async def parent_run(ctx: restate.ObjectContext, req: dict[str, Any]) -> dict[str, Any]:
    durable = restate_runtime(ctx, id_seed=ctx.key())
    store = durable.stores.session
    assert store is not None
    session = await load_session(store, ctx.key()) or await create_session(
        id=ctx.key(), store=store
    )
    merged: list[MergedChild] = []
    effects = str(req["effects"])
    effect(effects, "enter")

    def spawned(payload: dict[str, Any]) -> None:
        effect(effects, f"spawn:complete {payload['call_id']} {payload['stats'].text}")

    agent = create_agent(
        provider=scripted(PARENT_SCRIPT),
        tools=[spawn_tool(ctx, merged)],
        durable=durable,
        session=session,
        hooks={"spawn:complete": spawned},
    )
    stats = await agent.run(prompt="delegate")
    return {
        "status": stats.status,
        "text": stats.text,
        "run_id": stats.run_id,
        "stats": stats.to_json(),
        "merged": [summary(m) for m in merged],
        "results": tool_results(session.turns),
        "turn_roles": [t.role for t in session.turns],
    }


@spawn_parent.handler(name="runs", kind="shared")
async def parent_runs(ctx: restate.ObjectSharedContext) -> list[dict[str, Any]]:
    store = restate_session_store(ctx, read_only=True)  # type: ignore[arg-type]
    session = await load_session(store, ctx.key())
    return [r.to_json() for r in session.runs] if session else []


# BackgroundWaiter ----------------------------------------------------------------------------


@contextmanager
def registry(path: str) -> Iterator[dict[str, Any]]:
    """The fake host's task registry, read and written under an exclusive lock."""
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        file = Path(path)
        data = json.loads(file.read_text()) if file.exists() else {}
        data.setdefault("tasks", [])
        data.setdefault("resumers", {})
        data.setdefault("settled", [])
        yield data
        file.write_text(json.dumps(data))


background_waiter = restate.Service("BackgroundWaiter")


@background_waiter.handler()
async def wait(ctx: restate.Context, req: dict[str, Any]) -> dict[str, Any]:
    """`{"registry": path, "task_id": str, "timeout_ms"?: float}`: wait for the task's exit."""
    path = str(req["registry"])
    effect(f"{path}.effects", "enter")

    def register(awakeable_id: str, task_id: str, handle: Any) -> None:
        effect(f"{path}.effects", f"register {task_id}")
        with registry(handle) as data:
            data["resumers"][task_id] = awakeable_id

    def probe(handle: Any, task_id: str) -> list[dict[str, Any]]:
        effect(f"{path}.effects", f"probe {task_id}")
        with registry(handle) as data:
            return list(data["tasks"])

    def settle(awakeable_id: str, task_id: str, exit: Any, handle: Any) -> None:
        with registry(handle) as data:
            data["settled"].append([task_id, exit])

    waiter = restate_wait_background(
        RestateWaitBackgroundOptions(ctx=ctx, register=register, probe=probe, settle=settle)
    )
    try:
        exit = await waiter(path, str(req["task_id"]), timeout_ms=req.get("timeout_ms"))
    except ToolError as error:  # a tool would return it to the model as an error result
        return {"error": str(error)}
    return {"exit": exit}


app = restate.app([tools_agent, spawn_parent, spawn_child, background_waiter])
