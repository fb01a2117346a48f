"""`tether.testing`, used as a user would: its pytest fixtures, a DurableAgent manifest with a
tool of its own, a `tether.restate` agent embedded in a Restate service, and everything stopped
at exit."""

from __future__ import annotations

import socket
import textwrap
import threading
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import restate
import yaml

from tether import create_agent, tool
from tether.providers import scripted
from tether.restate import RestateAwakeableToolOptions, restate_awakeable_tool, restate_runtime
from tether.session import create_session, load_session
from tether.testing import AgentHarness, RestateHarness, group_alive, wait_until

# --------------------------------------------------------------------------------------------
# A DurableAgent manifest, through the `tether_agent` fixture
# --------------------------------------------------------------------------------------------

TOOLS = '''
"""The release clerk's own tool: it records each deploy in the workspace's ledger."""
import os
from pathlib import Path

from tether import tool


@tool
async def deploy(version: str) -> str:
    """Deploy a version."""
    with (Path(os.environ["TETHER_WORKSPACE"]) / "ledger.log").open("a") as ledger:
        ledger.write(f"deploy {version}\\n")
    return f"deployed {version}"
'''

DEPLOY = {"tool_calls": [{"name": "deploy", "input": {"version": "1.4.0"}}]}


def write_agent(directory: Path) -> Path:
    """agent.yaml (a scripted model; `deploy` needs an approval) next to its tools module."""
    directory.mkdir()
    (directory / "release_tools.py").write_text(TOOLS)
    manifest = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "testing-clerk"},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": [DEPLOY, {"text": "done"}]},
            "tools": [
                {"name": "deploy", "python": "release_tools:deploy", "requireApproval": True}
            ],
        },
    }
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def tool_results(agent: AgentHarness, session: str) -> list[str]:
    record = agent.session(session)
    assert record is not None
    return [
        str(block["content"])
        for turn in record.turns
        for block in turn.content
        if block["type"] == "tool_result"
    ]


def test_an_approval_parks_survives_a_worker_crash_and_is_answered(
    tether_agent: Any, tmp_path: Path
) -> None:
    agent: AgentHarness = tether_agent(write_agent(tmp_path / "agent"))
    assert agent.workspace == tmp_path.resolve()
    ledger = tmp_path / "ledger.log"

    invocation = agent.start_run("s1", "ship 1.4.0")
    [call] = agent.parked(at_least=1)
    assert (call["tool"], call["session"], call["kind"]) == ("deploy", "s1", "approval")
    assert not ledger.exists()
    agent.restart_worker()  # the parked run lives in Restate, not in the worker
    assert agent.parked() == [call]
    agent.approve(call, approver="alice")
    result = agent.result(invocation)
    assert (result["status"], result["text"], result["tool_calls"]) == ("completed", "done", 1)
    assert ledger.read_text() == "deploy 1.4.0\n"
    assert agent.parked() == []
    session = agent.session("s1")
    assert session is not None
    assert [run.status for run in session.runs] == ["completed"]
    assert [turn.role for turn in session.turns] == ["user", "assistant", "user", "assistant"]
    assert tool_results(agent, "s1") == ["deployed 1.4.0"]
    [decision] = session.runs[0].decisions  # the audit trail: who approved what, and when
    assert decision == {
        "call_id": call["call_id"],
        "tool": "deploy",
        "kind": "approval",
        "approved": True,
        "approver": "alice",
        "decided_at": ANY,
    }

    second = agent.start_run("s2", "ship 1.4.0 again")
    [call] = agent.parked(at_least=1)
    agent.reject(call, "not today")
    assert agent.result(second)["status"] == "completed"
    assert ledger.read_text() == "deploy 1.4.0\n"  # rejected: not run
    [rejected] = tool_results(agent, "s2")
    assert "not today" in rejected
    rejected_session = agent.session("s2")
    assert rejected_session is not None
    [decision] = rejected_session.runs[0].decisions
    assert {k: decision[k] for k in ("tool", "approved")} == {"tool": "deploy", "approved": False}
    assert "not today" in decision["rejected"]
    assert agent.session("nobody") is None


# --------------------------------------------------------------------------------------------
# A `tether.restate` agent embedded in your own Restate service, through `tether_restate`
# --------------------------------------------------------------------------------------------

published: list[str] = []
"""The awakeable ids the service published (its `notify` runs in this process)."""
deployed: list[str] = []
attempts: list[str] = []

SCRIPT = [
    {"tool_calls": [{"name": "ask_owner", "input": {"question": "Which version?"}}]},
    {"tool_calls": [{"name": "deploy", "input": {"version": "2.0.0"}}]},
    {"text": "shipped"},
]


@tool
async def deploy(version: str) -> str:
    """Deploy a version."""
    deployed.append(version)
    return f"deployed {version}"


ask_owner = restate_awakeable_tool(
    RestateAwakeableToolOptions(
        name="ask_owner",
        description="Ask the owner a question and wait for the answer.",
        input_schema={"type": "object", "properties": {"question": {"type": "string"}}},
        notify=lambda awakeable_id, _input, _ctx: published.append(awakeable_id),
    )
)

release_agent = restate.VirtualObject("EmbeddedReleaseAgent")


@release_agent.handler()
async def run(ctx: restate.ObjectContext, request: dict[str, Any]) -> dict[str, Any]:
    attempts.append(ctx.key())
    durable = restate_runtime(ctx, id_seed=ctx.key())
    store = durable.stores.session
    assert store is not None
    session = await load_session(store, ctx.key()) or await create_session(
        id=ctx.key(), store=store
    )
    agent = create_agent(
        provider=scripted(SCRIPT), tools=[ask_owner, deploy], durable=durable, session=session
    )
    stats = await agent.run(request["prompt"])
    return {"status": stats.status, "text": stats.text, "turns": stats.turns}


def park_answer_and_read(harness: RestateHarness) -> None:
    for effects in (published, deployed, attempts):
        effects.clear()
    served = harness.serve(release_agent)
    assert served.worker is None  # in a thread of this process

    invocation = harness.send("EmbeddedReleaseAgent/r1/run", {"prompt": "release"})
    [awakeable_id] = wait_until(lambda: published[:], what="the published awakeable id")
    assert deployed == []
    harness.resolve_awakeable(awakeable_id, "2.0.0, please")
    result = harness.result(invocation)
    assert result == {"status": "completed", "text": "shipped", "turns": 3}
    assert deployed == ["2.0.0"]  # run once, replayed after
    assert published == [awakeable_id]

    session = harness.session("EmbeddedReleaseAgent", "r1")
    assert session is not None and [run.status for run in session.runs] == ["completed"]
    blocks = [block for turn in session.turns for block in turn.content]
    results = [block["content"] for block in blocks if block["type"] == "tool_result"]
    assert results == ["2.0.0, please", "deployed 2.0.0"]
    assert harness.session("EmbeddedReleaseAgent", "nobody") is None


def test_an_embedded_agent_parks_on_an_awakeable_and_resumes(tether_restate: Any) -> None:
    park_answer_and_read(tether_restate)


def test_the_same_when_every_await_suspends_and_replays() -> None:
    with RestateHarness(always_suspend=True) as harness:
        park_answer_and_read(harness)
    assert len(attempts) > 3  # each attempt ended at an await; the next one replayed


# --------------------------------------------------------------------------------------------
# Nothing is left behind
# --------------------------------------------------------------------------------------------

greeter = restate.Service("TestingGreeter")


@greeter.handler()
async def greet(ctx: restate.Context, name: str) -> str:
    return f"hello {name}"


ECHO = """
import restate

echo = restate.Service("TestingEcho")


@echo.handler()
async def say(ctx: restate.Context, text: str) -> str:
    return text


app = restate.app([echo])
"""


def listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def serving_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tether-testing-")]


def assert_gone(groups: list[int], ports: list[int], paths: list[Path]) -> None:
    assert [pid for pid in groups if group_alive(pid)] == []
    assert [port for port in ports if listening(port)] == []
    assert [path for path in paths if path.exists()] == []
    assert serving_threads() == []


def test_the_harnesses_stop_every_process_port_and_directory(tmp_path: Path) -> None:
    (tmp_path / "echo_service.py").write_text(textwrap.dedent(ECHO))
    with RestateHarness() as harness:
        in_thread = harness.serve([greeter])
        in_process = harness.serve(f"{tmp_path / 'echo_service.py'}:app")
        assert harness.call("TestingGreeter/greet", "you") == "hello you"
        assert harness.call("TestingEcho/say", "back") == "back"
        server, worker = harness.server, in_process.worker
        assert server.pid is not None and worker is not None and worker.pid is not None
        groups = [server.pid, worker.pid]
        ports = [server.ports.ingress, server.ports.admin, server.ports.node]
        ports += [int(in_thread.url.rsplit(":", 1)[1]), worker.port]
        paths = [server.base_dir, worker.log_path.parent]
        assert all(listening(port) for port in ports) and len(serving_threads()) == 1
    assert_gone(groups, ports, paths)

    manifest = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "testing-idle"},
        "spec": {"model": {"provider": "scripted", "name": "s", "script": [{"text": "idle"}]}},
    }
    with AgentHarness(manifest) as agent:  # a mapping, and a workspace of its own
        assert agent.run("s", "hello")["text"] == "idle"
        stack = agent.stack
        assert stack.worker.popen is not None and stack.sidecar.popen is not None
        assert stack.server.pid is not None
        groups = [stack.server.pid, stack.worker.popen.pid, stack.sidecar.popen.pid]
        ports = [stack.server.ports.ingress, stack.server.ports.admin, stack.server.ports.node]
        ports += [stack.worker_port, stack.sidecar_port]
        paths = [stack.server.base_dir, stack.data_dir, stack.spec.parent, agent.workspace]
        assert all(listening(port) for port in ports)
    assert_gone(groups, ports, paths)
