"""MCP tools on the real Restate stack (`tether.testing.AgentHarness`: restate-server, a worker
process, its sidecar): the worker SIGKILLed in the middle of an MCP call, an approval on an MCP
tool, and a server whose tool list changes between the first attempt and the replay."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.fakes.model_server import ModelServer, Reply, ToolCall
from tests.mcp.servers import HttpServerProcess, SuiteFiles
from tests.mcp.suite_server import TOOLS_V1
from tether.programs.local_http import request
from tether.session.session import INTERRUPTED_RESULT
from tether.testing import AgentHarness

AgentFactory = Callable[..., AgentHarness]


def agent_manifest(model: dict[str, Any], server: HttpServerProcess, **tool: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "mcp-clerk"},
        "spec": {
            "model": model,
            "tools": [{"name": "suite", "mcp": {"url": server.url}, **tool}],
        },
    }


def tool_results(agent: AgentHarness, session: str) -> list[tuple[str, bool]]:
    record = agent.session(session)
    assert record is not None
    return [
        (str(block["content"]), bool(block.get("is_error")))
        for turn in record.turns
        for block in turn.content
        if block["type"] == "tool_result"
    ]


def metric(agent: AgentHarness, line_start: str) -> float:
    body = request("GET", f"{agent.sidecar_url}/metrics", timeout=10).body.decode()
    return sum(float(line.split()[-1]) for line in body.splitlines() if line.startswith(line_start))


def test_an_unsafe_mcp_call_cut_off_by_a_crash_is_reported_and_never_sent_again(
    tether_agent: AgentFactory, suite_server_http: HttpServerProcess, suite_files: SuiteFiles
) -> None:
    script = [
        {"tool_calls": [{"name": "add", "input": {"a": 2, "b": 3}}]},
        {"tool_calls": [{"name": "slow_write", "input": {"key": "w"}}]},
        {"text": "done"},
    ]
    model = {"provider": "scripted", "name": "s", "script": script}
    manifest = agent_manifest(
        model,
        suite_server_http,
        mcp={"url": suite_server_http.url, "tools": {"add": {"requireApproval": True}}},
    )
    agent = tether_agent(manifest)

    invocation = agent.start_run("s1", "add, then write")
    [call] = agent.parked(at_least=1)  # requireApproval works on an MCP tool
    assert (call["tool"], json.loads(call["input_summary"])) == ("add", {"a": 2, "b": 3})
    assert suite_files.count("add") == 0
    agent.approve(call, approver="alice")

    suite_files.wait_for_calls("slow_write")  # the body runs, blocked: kill the worker now
    agent.restart_worker()
    suite_files.release()
    result = agent.result(invocation)

    assert result["status"] == "completed", result
    assert tool_results(agent, "s1") == [("5", False), (INTERRUPTED_RESULT, True)]
    assert suite_files.count("slow_write") == 1  # reported as interrupted, never re-sent
    assert suite_files.count("add") == 1
    keys = [c["idempotency_key"] for c in suite_files.calls()]  # one per call
    assert len(set(keys)) == 2 and all(keys)
    session = agent.session("s1")
    assert session is not None
    [decision] = session.runs[0].decisions
    assert (decision["tool"], decision["approver"]) == ("add", "alice")
    # Counted live only, by the worker that ran the call (the first one, now dead, counted add).
    assert (
        metric(
            agent,
            'tether_mcp_calls_total{agent="mcp-clerk",outcome="ok",server="suite",tool="add"}',
        )
        == 1
    )


def test_a_read_only_call_is_sent_again_once_and_the_replay_keeps_the_first_tool_list(
    tether_agent: AgentFactory,
    suite_server_http: HttpServerProcess,
    suite_files: SuiteFiles,
    model_server: ModelServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The real Anthropic SDK in the worker, against a server that speaks its wire format: the
    model is asked twice in all (its first answer is replayed, not paid for again), and its
    second request, made after the replay, offers the tools of the first listing although the
    server lists others by then."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    model_server.script(
        Reply(tool_calls=[ToolCall("slow_read", {"key": "r"})]), Reply(text=["read it"])
    )
    model = {"provider": "anthropic", "name": "claude-test", "baseUrl": model_server.anthropic_url}
    agent = tether_agent(agent_manifest(model, suite_server_http))

    invocation = agent.start_run("s1", "read r")
    suite_files.wait_for_calls("slow_read")
    suite_files.switch_tools(2)  # `add` gone, `multiply` new, for every new listing
    agent.restart_worker()
    suite_files.release()
    result = agent.result(invocation)

    assert result["status"] == "completed", result
    assert tool_results(agent, "s1") == [("slow_read done: r", False)]
    assert suite_files.count("slow_read") == 2  # read-only: sent again, once
    # ...with the key it had the first time: a server that acts once per key acts once.
    first_key, again_key = (c["idempotency_key"] for c in suite_files.calls("slow_read"))
    assert first_key and again_key == first_key and len(first_key) == 32
    first, second = (r for r in model_server.requests if r.path.endswith("/messages"))
    offered = [{tool["name"] for tool in r.body["tools"]} for r in (first, second)]
    assert offered == [set(TOOLS_V1), set(TOOLS_V1)]
    assert len(model_server.requests) == 2
