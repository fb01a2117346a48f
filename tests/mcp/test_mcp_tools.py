"""MCP servers' tools in the agent loop, on the embedded runtimes, against real servers: two that
others publish on PyPI (mcp-server-time, mcp-server-git; over stdio, and behind mcp-proxy over
streamable HTTP) and the suite's own (tests/mcp/suite_server.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import RecordingProvider
from tests.mcp.servers import HttpServerProcess, StdioServer, SuiteFiles
from tether import create_agent
from tether.durable import sqlite_runtime
from tether.spec import SpecError, parse_agent
from tether.spec.assemble import tools_from_spec
from tether.tools.mcp import MCPServer, MCPToolset, ToolOverride

CONVERT = {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}


def stdio(server: StdioServer, **settings: Any) -> MCPServer:
    return MCPServer(name="clock", command=server.argv, env=dict(server.env), **settings)


def http(server: HttpServerProcess, **settings: Any) -> MCPServer:
    return MCPServer(name="clock", url=server.url, **settings)


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "input": arguments}]}


def tool_results(agent: Any) -> list[dict[str, Any]]:
    return [
        {"is_error": False, **block}
        for turn in agent.session.turns
        for block in turn.content
        if block["type"] == "tool_result"
    ]


@pytest.mark.parametrize("transport", ["stdio", "streamable-http", "sse"])
async def test_an_agent_calls_a_published_servers_tool(
    transport: str, time_server_stdio: StdioServer, request: pytest.FixtureRequest
) -> None:
    if transport == "stdio":
        server = stdio(time_server_stdio)
    elif transport == "sse":  # the older transport, which mcp-proxy also serves
        proxy = request.getfixturevalue("time_server_http")
        server = MCPServer(name="clock", url=f"{proxy.base_url}/sse", transport="sse")
    else:
        server = http(request.getfixturevalue("time_server_http"))
    provider = RecordingProvider([call("convert_time", **CONVERT), {"text": "9 pm in Tokyo"}])
    agent = create_agent(provider=provider, tools=[MCPToolset(server)])

    stats = await agent.run("When is noon UTC in Tokyo?")

    assert stats.status == "completed", stats.error
    [result] = tool_results(agent)
    assert result["is_error"] is False
    converted = json.loads(str(result["content"]))
    assert converted["target"]["datetime"].endswith("T21:00:00+09:00")
    offered = {tool.name for tool in provider.requests[0].tools}
    assert offered == {"get_current_time", "convert_time"}
    # mcp-server-time marks both tools read-only: safe to run again after a crash.
    [listed] = [t for t in agent.tools if isinstance(t, MCPToolset)]
    assert {t.name: t.replay for t in listed.tools(await listed.list_tools())} == {
        "get_current_time": "safe",
        "convert_time": "safe",
    }
    await listed.aclose()


async def test_a_second_published_server_and_a_server_error_named_in_the_result(
    git_server_stdio: StdioServer, git_repo: Path
) -> None:
    server = MCPServer(name="git", command=git_server_stdio.argv, include=["git_status", "git_log"])
    provider = RecordingProvider(
        [
            call("git_status", repo_path=str(git_repo)),
            call("git_log", repo_path="/nonexistent/repository"),
            {"text": "done"},
        ]
    )
    agent = create_agent(provider=provider, tools=[MCPToolset(server)])

    stats = await agent.run("What is the state of the repository?")

    assert stats.status == "completed", stats.error
    assert {t.name for t in provider.requests[0].tools} == {"git_status", "git_log"}
    status, log = tool_results(agent)
    assert status["is_error"] is False and "On branch main" in str(status["content"])
    assert log["is_error"] is True
    assert str(log["content"]).startswith("Tool error: MCP server 'git': git_log: ")


async def test_annotations_decide_replay_safety_and_the_spec_overrides_them(
    suite_server_http: HttpServerProcess,
) -> None:
    def replay_of(**settings: Any) -> dict[str, str]:
        return {t.name: t.replay for t in toolset.tools(listing)}

    toolset = MCPToolset(http(suite_server_http))
    listing = await toolset.list_tools()
    await toolset.aclose()
    assert replay_of() == {
        "slow_read": "safe",  # readOnlyHint
        "slow_write": "unsafe",  # no hint: a call cut off by a crash is reported
        "add": "safe",
        "echo_headers": "safe",
        "fail": "unsafe",
    }
    tools = {t.name: t for t in toolset.tools(listing)}
    assert tools["add"].is_concurrency_safe and not tools["slow_write"].is_concurrency_safe

    toolset = MCPToolset(
        http(
            suite_server_http,
            replay="unsafe",
            tools={"add": ToolOverride(replay="safe", description="Adds.")},
            include=["slow_*", "add", "echo_*"],
            exclude=["slow_read"],
            prefix="suite_",
        )
    )
    tools = {t.name: t for t in toolset.tools(await toolset.list_tools())}
    assert {name: t.replay for name, t in tools.items()} == {
        "suite_slow_write": "unsafe",
        "suite_add": "safe",  # the tool's own override wins over the entry's
        "suite_echo_headers": "unsafe",
    }
    assert tools["suite_add"].spec.description == "Adds."
    await toolset.aclose()


async def test_a_server_down_at_run_start_fails_the_run_before_any_model_call() -> None:
    server = MCPServer(name="tickets", url="http://127.0.0.1:9/mcp", timeout=2)
    provider = RecordingProvider([{"text": "never"}])
    agent = create_agent(provider=provider, tools=[MCPToolset(server)])

    started = time.monotonic()
    stats = await agent.run("Open a ticket")

    assert stats.status == "error"
    assert stats.error is not None
    assert stats.error.startswith("MCP server 'tickets' (http://127.0.0.1:9/mcp) could not be")
    assert provider.requests == []  # nothing paid for
    assert time.monotonic() - started < 10  # three attempts, bounded


async def test_a_timeout_and_an_error_result_are_failed_tool_results_naming_the_server(
    suite_server_http: HttpServerProcess, suite_files: SuiteFiles
) -> None:
    seen: list[tuple[str, str, str]] = []
    toolset = MCPToolset(
        MCPServer(name="suite", url=suite_server_http.url, timeout=1.0),
        observe=lambda server, tool, outcome, seconds: seen.append((server, tool, outcome)),
    )
    provider = RecordingProvider(
        [
            call("slow_read", key="k"),
            call("fail", message="the disk is full"),
            call("add", a=2, b=3),
            {"text": "done"},
        ]
    )
    agent = create_agent(provider=provider, tools=[toolset])

    stats = await agent.run("go")

    assert stats.status == "completed", stats.error
    timed_out, failed, added = tool_results(agent)
    assert timed_out["is_error"] is True
    assert timed_out["content"] == "Tool error: MCP server 'suite': slow_read timed out after 1 s"
    assert failed["is_error"] is True
    assert failed["content"] == "Tool error: MCP server 'suite': fail: the disk is full"
    assert added == {
        **added,
        "is_error": False,
        "content": "5",
    }  # a new connection after the timeout
    assert seen == [
        ("suite", "slow_read", "timeout"),
        ("suite", "fail", "error"),
        ("suite", "add", "ok"),
    ]
    assert suite_files.count("slow_read") == 1


async def test_headers_come_from_the_environment_named_by_the_spec(
    suite_server_http: HttpServerProcess,
) -> None:
    manifest = parse_agent(
        {
            "apiVersion": "tether.dev/v1alpha1",
            "kind": "DurableAgent",
            "metadata": {"name": "headers"},
            "spec": {
                "model": {"provider": "scripted", "name": "s", "script": [{"text": "x"}]},
                "tools": [
                    {
                        "name": "suite",
                        "mcp": {
                            "url": suite_server_http.url,
                            "headers": [
                                {"name": "Authorization", "secretRef": {"name": "s", "key": "k"}},
                                {"name": "X-Team", "value": "platform"},
                            ],
                            "include": ["echo_headers"],
                        },
                    }
                ],
            },
        }
    )
    with pytest.raises(SpecError, match="TETHER_MCP_SUITE_AUTHORIZATION is not set"):
        tools_from_spec(manifest.spec, ".", env={})
    env = {"TETHER_MCP_SUITE_AUTHORIZATION": "Bearer t0ken"}
    [toolset] = tools_from_spec(manifest.spec, ".", env=env)
    assert isinstance(toolset, MCPToolset)
    await toolset.list_tools()
    headers = json.loads(str(await toolset.call("echo_headers", {})))
    await toolset.aclose()
    assert headers["authorization"] == "Bearer t0ken"
    assert headers["x-team"] == "platform"


class Crash(BaseException):
    """Stands for the process dying: nothing in the loop catches it."""


class CrashingProvider(RecordingProvider):
    """Dies at its second call, after recording it."""

    async def complete(self, request: Any, on_text: Any = None) -> Any:
        if len(self.requests) == 1:
            self.requests.append(request)
            raise Crash
        return await super().complete(request, on_text)


async def test_a_resumed_run_is_offered_the_tools_it_started_with(
    suite_server_http: HttpServerProcess, suite_files: SuiteFiles, tmp_path: Path
) -> None:
    """The listing is journaled: a run resumed from its journal after the server changed its
    tools is offered the tools of its first listing; a new run sees the new list."""
    database = tmp_path / "runs.db"
    script = [call("add", a=1, b=2), {"text": "three"}]

    async def run(run_id: str, provider: RecordingProvider) -> Any:
        with sqlite_runtime(database, run_id) as durable:
            toolset = MCPToolset(http(suite_server_http))
            agent = create_agent(provider=provider, tools=[toolset], durable=durable)
            return await agent.run("add 1 and 2")

    with pytest.raises(Crash):
        await run("r1", CrashingProvider(script))
    assert suite_files.count("add") == 1
    suite_files.switch_tools(2)

    resumed = RecordingProvider(script)
    stats = await run("r1", resumed)

    assert stats.status == "completed" and stats.text == "three", stats.error
    [request] = resumed.requests  # the second model call, live after the replay
    offered = {tool.name for tool in request.tools}
    assert "add" in offered and "multiply" not in offered
    assert suite_files.count("add") == 1  # replayed from the journal, not sent again

    fresh = RecordingProvider([{"text": "ok"}])
    await run("r2", fresh)
    offered = {tool.name for tool in fresh.requests[0].tools}
    assert "multiply" in offered and "add" not in offered
