"""The Restate tools on the real restate-server: awakeable tools, two-phase `restate_tool`,
spawned child invocations and `restate_wait_background` (services in
`services/tools_service.py`). Every wait is a poll with a deadline."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import tool_context
from tests.restate.support import ServedApp, count, http, read_lines, wait_until
from tether import ToolContext
from tether.agent.stats import AgentStats
from tether.programs.restate_server import RestateServer
from tether.restate import (
    AwakeableDriftError,
    ChildRunRequest,
    InFlightChild,
    RestateAwakeableToolOptions,
    RestateSpawnToolOptions,
    restate_awakeable_tool,
    restate_spawn_tool,
)

#: Generous: another suite may run Restate tests on the same 2 cores at the same time.
DEADLINE = 180.0

Serve = Callable[..., ServedApp]


# Helpers ------------------------------------------------------------------------------------


def send(server: RestateServer, target: str, payload: Any) -> str:
    """Start `target` (`Service/handler` or `Object/key/handler`); return the invocation id."""
    response = http("POST", f"{server.ingress_url}/{target}/send", payload)
    assert response.status == 202, response.text
    invocation_id: str = response.json()["invocationId"]
    return invocation_id


def attach(server: RestateServer, invocation_id: str) -> Any:
    response = http(
        "GET", f"{server.ingress_url}/restate/invocation/{invocation_id}/attach", timeout=DEADLINE
    )
    assert response.status == 200, response.text
    return response.json()


def status(server: RestateServer, invocation_id: str) -> str | None:
    rows = server.query(f"SELECT status FROM sys_invocation WHERE id = '{invocation_id}'")
    return str(rows[0]["status"]) if rows else None


def wait_status(server: RestateServer, invocation_id: str, wanted: str) -> None:
    wait_until(
        lambda: status(server, invocation_id) == wanted,
        timeout=DEADLINE,
        what=f"invocation {invocation_id} {wanted}",
    )


def journal_entries(server: RestateServer, invocation_id: str) -> list[dict[str, Any]]:
    return server.query(
        f"SELECT index, entry_type, name FROM sys_journal WHERE id = '{invocation_id}' "
        "ORDER BY index"
    )


def run_journaled(server: RestateServer, invocation_id: str, name: str) -> bool:
    """Whether the `ctx.run_typed` entry `name` has its result in the journal (a kill after
    that point cannot make its body run again)."""
    rows = server.query(
        f"SELECT entry_type, name, entry_lite_json FROM sys_journal WHERE id = '{invocation_id}'"
    )
    entries = [(r["entry_type"], r.get("name"), json.loads(r["entry_lite_json"])) for r in rows]
    commands = {
        e["Command"]["Run"]["completion_id"]
        for kind, entry_name, e in entries
        if kind == "Command: Run" and entry_name == name
    }
    completions = {
        e["Notification"]["id"].get("CompletionId")
        for kind, _, e in entries
        if kind == "Notification: Run"
    }
    return bool(commands & completions)


def wait_journaled(server: RestateServer, invocation_id: str, name: str) -> None:
    wait_until(
        lambda: run_journaled(server, invocation_id, name),
        timeout=DEADLINE,
        what=f"the journaled result of {name!r}",
    )


def awakeable(server: RestateServer, awakeable_id: str, verb: str, body: bytes) -> None:
    url = f"{server.ingress_url}/restate/awakeables/{awakeable_id}/{verb}"
    response = http("POST", url, raw=body, headers={"content-type": "application/json"})
    assert response.status == 202, response.text


def resolve(server: RestateServer, awakeable_id: str, value: Any) -> None:
    awakeable(server, awakeable_id, "resolve", json.dumps(value).encode())


def line_with(path: Path, prefix: str) -> str:
    """The first line of `path` that starts with `prefix`, once it is there."""
    found: str = wait_until(
        lambda: next((x for x in read_lines(path) if x.startswith(prefix)), None),
        timeout=DEADLINE,
        what=f"a line {prefix!r} in {path.name}",
    )
    return found


def new_key() -> str:
    return uuid.uuid4().hex[:12]


def start_tools_agent(server: RestateServer, effects: Path, scenario: str, **extra: Any) -> str:
    payload = {"scenario": scenario, "effects": str(effects), **extra}
    return send(server, f"ToolsAgent/{new_key()}/run", payload)


def kill_and_restart(served: ServedApp, invocation_id: str) -> None:
    """SIGKILL the worker's process group, wait until the server backs off, start it again."""
    served.worker.kill(signal.SIGKILL)
    wait_status(served.server, invocation_id, "backing-off")
    served.worker.restart()  # same port, same deployment: the invocation stays pinned to it


# Awakeable tool -----------------------------------------------------------------------------


def test_awakeable_tool_suspends_until_resolved_through_the_ingress(
    serve_app: Serve, restate_server_always_suspend: RestateServer, tmp_path: Path
) -> None:
    server = restate_server_always_suspend
    serve_app("tools_service", server=server)
    effects = tmp_path / "effects"
    invocation = start_tools_agent(server, effects, "approve")

    line = line_with(effects, "notify ")
    _, call_id, awakeable_id = line.split()
    assert awakeable_id.startswith("sign_1")
    wait_status(server, invocation, "suspended")

    resolve(server, awakeable_id, {"approved_by": "ops"})
    result = attach(server, invocation)
    assert result["status"] == "completed" and result["text"] == "finished"
    assert result["results"] == [
        {"id": call_id, "content": 'release v2: {"approved_by": "ops"}', "is_error": False}
    ]
    lines = read_lines(effects)
    assert count(lines, line) == 1, lines  # notify ran once, however often the handler replayed
    assert count(lines, "enter") > 2, "every await should have suspended and replayed"


def test_awakeable_tool_rejection_is_an_error_result(
    serve_app: Serve, restate_server: RestateServer, tmp_path: Path
) -> None:
    serve_app("tools_service")
    effects = tmp_path / "effects"
    invocation = start_tools_agent(restate_server, effects, "approve")
    awakeable_id = line_with(effects, "notify ").split()[2]

    awakeable(restate_server, awakeable_id, "reject", b"denied by ops")
    result = attach(restate_server, invocation)
    assert result["status"] == "completed" and result["text"] == "finished"
    [only] = result["results"]
    assert only["is_error"] is True
    assert only["content"] == "Tool error: rejected: denied by ops"


def test_awakeable_tool_timeout_is_a_durable_race(
    serve_app: Serve, restate_server: RestateServer, tmp_path: Path
) -> None:
    serve_app("tools_service")
    effects = tmp_path / "effects"
    invocation = start_tools_agent(restate_server, effects, "approve", timeout_ms=400)

    result = attach(restate_server, invocation)
    assert result["status"] == "completed"
    [only] = result["results"]
    assert only["is_error"] is True
    assert "no answer within 400 ms" in only["content"]
    types = [e["entry_type"] for e in journal_entries(restate_server, invocation)]
    assert "Command: Sleep" in types, types  # the deadline was a journaled timer
    assert count(read_lines(effects), "enter") == 1


def test_awakeable_tool_survives_a_killed_worker(
    serve_app: Serve, restate_server: RestateServer, tmp_path: Path
) -> None:
    served = serve_app("tools_service")
    effects = tmp_path / "effects"
    invocation = start_tools_agent(restate_server, effects, "approve")
    line = line_with(effects, "notify ")
    wait_journaled(restate_server, invocation, f"approve-notify:{line.split()[1]}")
    wait_status(restate_server, invocation, "running")  # parked inside the live attempt

    kill_and_restart(served, invocation)
    wait_until(
        lambda: count(read_lines(effects), "enter") == 2, timeout=DEADLINE, what="the replay"
    )
    wait_status(restate_server, invocation, "running")  # parked again, on the same awakeable
    resolve(restate_server, line.split()[2], "yes")

    result = attach(restate_server, invocation)
    assert result["status"] == "completed"
    assert result["results"][0]["content"] == 'release v2: "yes"'
    lines = read_lines(effects)
    assert count(lines, line) == 1 and count(lines, "enter") == 2, lines


# restate_tool -------------------------------------------------------------------------------


@pytest.mark.parametrize("server_fixture", ["restate_server", "restate_server_always_suspend"])
def test_soft_errors_become_error_results(
    serve_app: Serve, server_fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    server: RestateServer = request.getfixturevalue(server_fixture)
    serve_app("tools_service", server=server)
    effects = tmp_path / "effects"
    invocation = start_tools_agent(server, effects, "soft")

    result = attach(server, invocation)
    assert result["status"] == "completed" and result["text"] == "finished"
    assert [(r["content"], r["is_error"]) for r in result["results"]] == [
        ("Tool error: ValueError: boom", True),
        ("Tool error: nope", True),
        ("all good", False),
    ]
    names = [e.get("name") for e in journal_entries(server, invocation)]
    for entry in ("tool-explode-1", "tool-polite-1", "tool-fine-1"):
        assert names.count(entry) == 1, names
    lines = read_lines(effects)
    for tool in ("explode", "polite", "fine"):  # each body ran once, replays or not
        assert sum(1 for x in lines if x.startswith(f"{tool} ")) == 1, lines


def test_durable_start_wait_registers_parks_and_shapes_the_result(
    serve_app: Serve, restate_server: RestateServer, tmp_path: Path
) -> None:
    """Killed after register: start and register are not called again; the replay re-parks
    on the same awakeable, and the resumer's payload becomes the result."""
    served = serve_app("tools_service")
    effects = tmp_path / "effects"
    invocation = start_tools_agent(restate_server, effects, "deploy_wait")
    start = line_with(effects, "start ")
    _, token, awakeable_id = line_with(effects, "register ").split()
    assert token == f"job-{start.split()[1]}"
    wait_journaled(restate_server, invocation, "tool-deploy-1-register")
    wait_status(restate_server, invocation, "running")

    kill_and_restart(served, invocation)
    resolve(restate_server, awakeable_id, {"log": "deployed v2"})

    result = attach(restate_server, invocation)
    assert result["status"] == "completed"
    assert result["results"][0] == {
        "id": start.split()[1],
        "content": f"{token}: deployed v2",
        "is_error": False,
    }
    lines = read_lines(effects)
    assert count(lines, start) == 1 and count(lines, "enter") == 2, lines
    assert sum(1 for x in lines if x.startswith("register ")) == 1, lines
    names = [e.get("name") for e in journal_entries(restate_server, invocation)]
    for suffix in ("start", "register", "result"):
        assert f"tool-deploy-1-{suffix}" in names, names


def test_durable_start_wait_when_every_await_suspends(
    serve_app: Serve, restate_server_always_suspend: RestateServer, tmp_path: Path
) -> None:
    server = restate_server_always_suspend
    serve_app("tools_service", server=server)
    effects = tmp_path / "effects"
    invocation = start_tools_agent(server, effects, "deploy_wait", timeout_ms=None)
    _, token, awakeable_id = line_with(effects, "register ").split()
    wait_status(server, invocation, "suspended")

    resolve(server, awakeable_id, {"log": "deployed v3"})
    result = attach(server, invocation)
    assert result["results"][0]["content"] == f"{token}: deployed v3"
    lines = read_lines(effects)
    assert count(lines, "enter") > 2, lines
    for phase in ("start ", "register "):
        assert sum(1 for x in lines if x.startswith(phase)) == 1, lines


def test_durable_start_attach_reattaches_with_the_same_token(
    serve_app: Serve, restate_server: RestateServer, tmp_path: Path
) -> None:
    served = serve_app("tools_service")
    effects = tmp_path / "effects"
    invocation = start_tools_agent(restate_server, effects, "deploy_attach")
    start = line_with(effects, "start ")
    token = line_with(effects, "attach ").split()[1]
    wait_journaled(restate_server, invocation, "tool-deploy-1-start")

    kill_and_restart(served, invocation)
    wait_until(
        lambda: count(read_lines(effects), f"attach {token}") == 2,
        timeout=DEADLINE,
        what="the replay to re-attach",
    )
    Path(f"{effects}.{token}.done").write_text("exit 0")

    result = attach(restate_server, invocation)
    assert result["results"][0]["content"] == f"{token}: exit 0"
    lines = read_lines(effects)
    assert count(lines, start) == 1, lines  # the start was journaled: never called again


def test_durable_start_cancelled_while_parked_runs_on_abort_once(
    serve_app: Serve, restate_server: RestateServer, tmp_path: Path
) -> None:
    serve_app("tools_service")
    effects = tmp_path / "effects"
    invocation = start_tools_agent(restate_server, effects, "deploy_wait")
    token = line_with(effects, "register ").split()[1]
    wait_status(restate_server, invocation, "running")

    response = http("PATCH", f"{restate_server.admin_url}/invocations/{invocation}/cancel")
    assert response.status in (200, 202), response.text
    outcome = http("GET", f"{restate_server.ingress_url}/restate/invocation/{invocation}/attach")
    assert outcome.status != 200 and "cancel" in outcome.text.lower(), outcome.text
    assert count(read_lines(effects), f"abort {token}") == 1
    names = [e.get("name") for e in journal_entries(restate_server, invocation)]
    assert "tool-deploy-1-abort" in names, names


# Spawn --------------------------------------------------------------------------------------


@pytest.mark.parametrize("server_fixture", ["restate_server", "restate_server_always_suspend"])
def test_spawned_children_run_as_invocations_and_merge_into_the_parent(
    serve_app: Serve, server_fixture: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """With every await suspending too: the labels, the merged records and the hook calls
    must come out the same when the parent replays from the top at every step."""
    server: RestateServer = request.getfixturevalue(server_fixture)
    serve_app("tools_service", server=server)
    key, effects = new_key(), tmp_path / "effects"
    invocation = send(server, f"SpawnParent/{key}/run", {"effects": str(effects)})
    result = attach(server, invocation)

    assert result["status"] == "completed" and result["text"] == "parent done"
    fan_out, single = result["results"]
    assert not fan_out["is_error"] and not single["is_error"]
    assert fan_out["content"] == "[child-1] child-1 did alpha\n\n[child-2] child-2 did beta"
    assert single["content"] == "child-3 fanned out gamma"
    # Only the parent's own conversation is in its turns: user, (assistant, user) x 2, final.
    assert result["turn_roles"] == ["user", "assistant", "user", "assistant", "user", "assistant"]

    # Merged subtrees, relabeled from the parent's counter; depth relative to the parent.
    assert result["merged"] == [
        {"label": "child-1", "task": "leaf alpha", "depth": 1, "status": "completed",
         "turns": 2, "children": []},
        {"label": "child-2", "task": "leaf beta", "depth": 1, "status": "completed",
         "turns": 2, "children": []},
        {"label": "child-3", "task": "fanout gamma", "depth": 1, "status": "completed",
         "turns": 4, "children": [
             {"label": "child-4", "task": "deep gamma", "depth": 2, "status": "completed",
              "turns": 4, "children": []}]},
    ]  # fmt: skip

    # The children's stats joined the parent's, grandchild included.
    stats = AgentStats.from_json(result["stats"])
    assert [c.text for c in stats.children] == [
        "child-1 did alpha",
        "child-2 did beta",
        "child-3 fanned out gamma",
    ]
    [grandchild] = stats.children[2].children
    assert grandchild.text == "child-1 went deep on gamma"  # labeled by its own parent
    assert grandchild.turns == 2 and grandchild.tool_calls == 1
    assert stats.total_tokens == stats.tokens + sum(c.total_tokens for c in stats.children)
    assert stats.total_tokens > stats.tokens + sum(c.tokens for c in stats.children)

    # spawn:complete fired once per direct child, replays or not.
    lines = read_lines(effects)
    assert (count(lines, "enter") > 1) == (server_fixture == "restate_server_always_suspend")
    assert [x for x in lines if x != "enter"] == [
        f"spawn:complete {fan_out['id']} child-1 did alpha",
        f"spawn:complete {fan_out['id']} child-2 did beta",
        f"spawn:complete {single['id']} child-3 fanned out gamma",
    ]

    # The parent's session holds a run record for every descendant.
    runs = http("POST", f"{server.ingress_url}/SpawnParent/{key}/runs").json()
    by_prompt = {r["prompt"]: r for r in runs}
    assert set(by_prompt) == {"delegate", "leaf alpha", "leaf beta", "fanout gamma", "deep gamma"}
    parent_run = by_prompt["delegate"]
    assert parent_run["id"] == result["run_id"] and parent_run["parent_run_id"] is None
    call_ids = [fan_out["id"], fan_out["id"], single["id"]]
    for prompt, call_id in zip(["leaf alpha", "leaf beta", "fanout gamma"], call_ids, strict=True):
        child = by_prompt[prompt]
        assert child["parent_run_id"] == parent_run["id"]
        assert child["parent_call_id"] == call_id
        assert child["status"] == "completed" and child["stats"]["turns"] >= 1
    deep = by_prompt["deep gamma"]
    assert deep["parent_run_id"] == by_prompt["fanout gamma"]["id"]
    assert deep["id"] == grandchild.run_id
    assert deep["ended_at"] is not None and deep["started_at"] <= deep["ended_at"]


def test_a_child_too_deep_is_refused_and_the_run_goes_on(
    serve_app: Serve, restate_server: RestateServer
) -> None:
    """The grandchild (depth 2) asks for a depth-3 child: refused before any dispatch."""
    serve_app("tools_service")
    request = {"task": "deep delta", "depth": 2, "label": "child-9"}
    response = http("POST", f"{restate_server.ingress_url}/SpawnChild/run", request)
    assert response.status == 200, response.text
    result = response.json()
    assert result["status"] == "completed" and result["text"] == "child-9 went deep on delta"
    assert "children" not in result
    refusal = result["turns"][2]["content"][0]
    assert refusal["is_error"] is True and "at most 2 deep" in refusal["content"]

    too_deep = {"task": "leaf x", "depth": 3, "label": "child-1"}
    response = http("POST", f"{restate_server.ingress_url}/SpawnChild/run", too_deep)
    refused = response.json()
    assert refused["status"] == "error" and "over the limit of 2" in refused["error"]
    assert refused["turns"] == []


# wait_background ------------------------------------------------------------------------------


def write_registry(path: Path, tasks: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"tasks": tasks, "resumers": {}, "settled": []}))


def read_registry(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_wait_background_parks_on_a_running_task_until_it_exits(
    serve_app: Serve, restate_server: RestateServer, tmp_path: Path
) -> None:
    serve_app("tools_service")
    registry = tmp_path / "registry.json"
    write_registry(registry, [{"id": "t1", "status": "running"}])
    invocation = send(
        restate_server, "BackgroundWaiter/wait", {"registry": str(registry), "task_id": "t1"}
    )
    awakeable_id = wait_until(
        lambda: read_registry(registry)["resumers"].get("t1"), timeout=DEADLINE, what="resumer"
    )
    line_with(Path(f"{registry}.effects"), "probe t1")
    wait_status(restate_server, invocation, "running")

    exit_info = {"code": 0, "signal": None}
    write_registry(registry, [{"id": "t1", "status": "exited", "exit": exit_info}])
    resolve(restate_server, awakeable_id, exit_info)  # what the host's exit hook does
    assert attach(restate_server, invocation) == {"exit": exit_info}
    assert read_registry(registry)["settled"] == [["t1", exit_info]]


def test_wait_background_rejected_resumer_is_an_error(
    serve_app: Serve, restate_server: RestateServer, tmp_path: Path
) -> None:
    serve_app("tools_service")
    registry = tmp_path / "registry.json"
    write_registry(registry, [{"id": "t1", "status": "running"}])
    invocation = send(
        restate_server, "BackgroundWaiter/wait", {"registry": str(registry), "task_id": "t1"}
    )
    awakeable_id = wait_until(
        lambda: read_registry(registry)["resumers"].get("t1"), timeout=DEADLINE, what="resumer"
    )
    awakeable(restate_server, awakeable_id, "reject", b"runner lost")
    result = attach(restate_server, invocation)
    assert result == {"error": "the wait for task t1 was rejected: runner lost"}
    assert read_registry(registry)["settled"] == [["t1", None]]


@pytest.mark.parametrize(
    ("tasks", "timeout_ms", "expected"),
    [
        ([{"id": "t1", "status": "exited", "exit": {"code": 3}}], None, {"code": 3}),
        ([{"id": "other", "status": "running"}], None, None),
        ([{"id": "t1", "status": "running"}], 300, None),
    ],
    ids=["already-exited", "unknown-task", "timeout"],
)
def test_wait_background_without_a_resumer(
    serve_app: Serve,
    restate_server: RestateServer,
    tmp_path: Path,
    tasks: list[dict[str, Any]],
    timeout_ms: float | None,
    expected: dict[str, Any] | None,
) -> None:
    serve_app("tools_service")
    registry = tmp_path / "registry.json"
    write_registry(registry, tasks)
    payload = {"registry": str(registry), "task_id": "t1", "timeout_ms": timeout_ms}
    invocation = send(restate_server, "BackgroundWaiter/wait", payload)

    assert attach(restate_server, invocation) == {"exit": expected}
    data = read_registry(registry)
    assert "t1" in data["resumers"]  # registered before the probe, whatever the probe found
    assert data["settled"] == [["t1", expected]]
    types = [e["entry_type"] for e in journal_entries(restate_server, invocation)]
    assert ("Command: Sleep" in types) == (timeout_ms is not None), types


# Without a server: what a replay cannot reproduce ---------------------------------------------


class DriftedContext:
    """A context whose journal published another awakeable id than the one minted now."""

    def __init__(self) -> None:
        self.notified = 0

    def awakeable(self, serde: Any = None, type_hint: Any = None) -> tuple[str, Any]:
        return "sign_1minted", asyncio.get_running_loop().create_future()

    async def run_typed(self, name: str, action: Any, options: Any = None) -> str:
        return "sign_1published"  # replayed: the body does not run


async def test_a_replay_that_mints_another_awakeable_fails_instead_of_parking() -> None:
    ctx = DriftedContext()

    def notify(awakeable_id: str, arguments: dict[str, Any], tool_ctx: ToolContext) -> None:
        ctx.notified += 1

    options: RestateAwakeableToolOptions[Any] = RestateAwakeableToolOptions(
        name="approve", description="d", input_schema={"type": "object"}, notify=notify
    )
    approve = restate_awakeable_tool(options, ctx=ctx)  # type: ignore[arg-type]
    with pytest.raises(AwakeableDriftError, match="sign_1published"):
        await approve.execute({}, tool_context())
    assert ctx.notified == 0


@pytest.mark.parametrize("aborted", [True, False], ids=["run-aborted", "torn-down"])
async def test_spawn_on_abort_sees_the_children_in_flight(aborted: bool) -> None:
    seen: list[list[InFlightChild]] = []
    pending: list[asyncio.Future[Any]] = []
    both_dispatched = asyncio.Event()

    def dispatch(request: ChildRunRequest, tool_ctx: ToolContext) -> asyncio.Future[Any]:
        pending.append(asyncio.get_running_loop().create_future())
        if len(pending) == 2:
            both_dispatched.set()
        return pending[-1]

    spawn = restate_spawn_tool(
        RestateSpawnToolOptions(
            dispatch=dispatch, on_abort=lambda in_flight, tool_ctx: seen.append(in_flight)
        )
    )
    ctx = tool_context()
    task = asyncio.ensure_future(spawn.execute({"tasks": ["a", "b"]}, ctx))
    await asyncio.wait_for(both_dispatched.wait(), timeout=10)
    if aborted:
        ctx.signal.set()
    task.cancel()  # what the loop does to a tool call when the run is aborted
    with pytest.raises(asyncio.CancelledError):
        await task
    expected = [[{"label": "child-1", "task": "a", "depth": 1},
                 {"label": "child-2", "task": "b", "depth": 1}]]  # fmt: skip
    assert seen == (expected if aborted else [])
