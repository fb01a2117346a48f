"""The MCP test servers work, seen through the plain `mcp` 2.3 `Client`: the real PyPI servers
over stdio and behind `mcp-proxy` over streamable HTTP, and the suite's own server over both, its
tool list changing under a new connection."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from datetime import UTC, datetime
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent, Tool

from tests.mcp.servers import (
    INSTALL_SCRIPT,
    HttpServerProcess,
    LoopbackSite,
    StdioServer,
    SuiteFiles,
    pid_alive,
    port_is_free,
)

TIMEOUT = 30.0
HANDSHAKE_ERA = "2025-11-25"
MODERN = "2026-07-28"


def hints(tool: Tool) -> dict[str, bool]:
    """The tool's annotations that are set, by their wire names."""
    if tool.annotations is None:
        return {}
    dumped = tool.annotations.model_dump(by_alias=True, exclude_none=True)
    return {k: v for k, v in dumped.items() if k.endswith("Hint")}


def text(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


async def tools_of(client: Client) -> dict[str, Tool]:
    return {tool.name: tool for tool in (await client.list_tools()).tools}


READ_ONLY_CLOSED = {
    "readOnlyHint": True,
    "destructiveHint": False,
    "idempotentHint": True,
    "openWorldHint": False,
}


def test_install_script_is_idempotent(mcp_packages: dict[str, Any]) -> None:
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, check=True, timeout=60
    )
    elapsed = time.monotonic() - started
    assert elapsed < 1.0, f"a second run took {elapsed:.2f}s: {done.stderr}"
    assert done.stderr == ""
    listed = {line.split()[0]: line.split()[2] for line in done.stdout.splitlines()}
    assert listed == {name: str(p.venv) for name, p in mcp_packages.items()}
    assert set(listed) == {"mcp-server-time", "mcp-server-git", "mcp-server-fetch", "mcp-proxy"}


async def test_time_server_over_stdio(time_server_stdio: StdioServer) -> None:
    async with Client(time_server_stdio.params(), read_timeout_seconds=TIMEOUT) as client:
        assert client.protocol_version == MODERN  # an mcp 2.3 server: mode="auto" goes modern
        tools = await tools_of(client)
        assert set(tools) == {"get_current_time", "convert_time"}
        assert all(hints(tool) == READ_ONLY_CLOSED for tool in tools.values())

        # Zones without daylight saving time, so the answer does not depend on the date.
        result = await client.call_tool(
            "convert_time",
            {"source_timezone": "UTC", "time": "16:30", "target_timezone": "Asia/Kolkata"},
        )
        assert not result.is_error, text(result)
        assert result.structured_content is not None
        assert result.structured_content["target"]["datetime"].endswith("T22:00:00+05:30")
        assert result.structured_content["time_difference"] == "+5.5h"

        result = await client.call_tool("get_current_time", {"timezone": "UTC"})
        assert not result.is_error, text(result)
        assert result.structured_content is not None
        now = datetime.fromisoformat(result.structured_content["datetime"])
        assert abs((now - datetime.now(UTC)).total_seconds()) < 120


async def test_time_server_behind_mcp_proxy(time_server_http: HttpServerProcess) -> None:
    assert time_server_http.url.endswith("/mcp")
    # mcp-proxy is built on mcp 1.x: it answers the server/discover probe of mode="auto" with
    # HTTP 400, and the client falls back to the initialize handshake by itself.
    async with Client(time_server_http.url, read_timeout_seconds=TIMEOUT) as client:
        assert client.protocol_version == HANDSHAKE_ERA
        assert client.server_info is not None and client.server_info.name == "mcp-time"
        tools = await tools_of(client)
        assert set(tools) == {"get_current_time", "convert_time"}
        assert all(hints(tool) == READ_ONLY_CLOSED for tool in tools.values())
        result = await client.call_tool(
            "convert_time",
            {"source_timezone": "UTC", "time": "09:15", "target_timezone": "Asia/Tokyo"},
        )
        assert not result.is_error, text(result)
        assert result.structured_content is not None
        assert result.structured_content["target"]["datetime"].endswith("T18:15:00+09:00")


async def test_git_server_over_stdio(git_server_stdio: StdioServer, git_repo: Any) -> None:
    async with Client(git_server_stdio.params(), read_timeout_seconds=TIMEOUT) as client:
        tools = await tools_of(client)
        assert hints(tools["git_status"]) == READ_ONLY_CLOSED
        assert hints(tools["git_reset"])["destructiveHint"] is True
        assert hints(tools["git_commit"]) == {
            "readOnlyHint": False,
            "destructiveHint": False,
            "idempotentHint": False,
            "openWorldHint": False,
        }
        result = await client.call_tool("git_log", {"repo_path": str(git_repo)})
        assert not result.is_error, text(result)
        assert "first commit" in text(result)
        result = await client.call_tool("git_status", {"repo_path": str(git_repo)})
        assert "notes.txt" in text(result)


async def test_fetch_server_over_stdio(
    fetch_server_stdio: StdioServer, loopback_site: LoopbackSite
) -> None:
    asked_before = len(loopback_site.paths)
    async with Client(fetch_server_stdio.params(), read_timeout_seconds=TIMEOUT) as client:
        tools = await tools_of(client)
        assert hints(tools["fetch"]) == {**READ_ONLY_CLOSED, "openWorldHint": True}
        result = await client.call_tool("fetch", {"url": loopback_site.url})
        assert not result.is_error, text(result)
        assert "forty-two" in text(result)
    assert loopback_site.paths[asked_before:] == ["/page.html"]  # --ignore-robots-txt


async def test_fetch_server_refuses_loopback_by_default(
    fetch_server_stdio: StdioServer, loopback_site: LoopbackSite
) -> None:
    argv = tuple(a for a in fetch_server_stdio.argv if a != "--allow-private-ips")
    server = StdioServer("mcp-server-fetch", argv)
    asked_before = len(loopback_site.paths)
    async with Client(server.params(), read_timeout_seconds=TIMEOUT) as client:
        result = await client.call_tool("fetch", {"url": loopback_site.url})
    assert result.is_error
    assert "not a public address" in text(result)
    assert loopback_site.paths[asked_before:] == []


async def test_suite_server_over_http(
    suite_server_http: HttpServerProcess, suite_files: SuiteFiles
) -> None:
    headers = {"X-Tether-Test": "forwarded", "Authorization": "Bearer secret-token"}
    async with (
        httpx2.AsyncClient(headers=headers) as http,
        Client(
            streamable_http_client(suite_server_http.url, http_client=http),
            read_timeout_seconds=TIMEOUT,
        ) as client,
    ):
        assert client.protocol_version == MODERN
        tools = await tools_of(client)
        assert set(tools) == {"slow_read", "slow_write", "add", "echo_headers", "fail"}
        assert hints(tools["slow_read"]) == {"readOnlyHint": True}
        assert hints(tools["add"]) == {"readOnlyHint": True}
        assert tools["slow_write"].annotations is None
        assert tools["fail"].annotations is None

        result = await client.call_tool("add", {"a": 2, "b": 40})
        assert not result.is_error and result.structured_content == {"result": 42}
        result = await client.call_tool("fail", {"message": "no luck"})
        assert result.is_error and text(result) == "no luck"
        result = await client.call_tool("echo_headers", {})
        echoed = json.loads(text(result))
        assert echoed["x-tether-test"] == "forwarded"
        assert echoed["authorization"] == "Bearer secret-token"

    assert [(c["tool"], c["arguments"]) for c in suite_files.calls()] == [
        ("add", {"a": 2, "b": 40}),
        ("fail", {"message": "no luck"}),
        ("echo_headers", {}),
    ]


async def test_suite_server_over_stdio(
    suite_server_stdio: StdioServer, suite_files: SuiteFiles
) -> None:
    async with Client(suite_server_stdio.params(), read_timeout_seconds=TIMEOUT) as client:
        tools = await tools_of(client)
        assert set(tools) == {"slow_read", "slow_write", "add", "echo_headers", "fail"}
        result = await client.call_tool("add", {"a": 1, "b": 2})
        assert result.structured_content == {"result": 3}
        result = await client.call_tool("echo_headers", {})
        assert json.loads(text(result)) == {}
    assert suite_files.count("add") == 1


async def test_suite_tool_list_changes_between_connections(
    suite_server_http: HttpServerProcess, suite_files: SuiteFiles
) -> None:
    async with Client(suite_server_http.url, read_timeout_seconds=TIMEOUT) as first:
        assert "add" in await tools_of(first)
        assert not (await first.call_tool("add", {"a": 1, "b": 1})).is_error
        suite_files.switch_tools()
        # The same connection, default response cache: the list carries ttlMs 0, nothing cached.
        assert "multiply" in await tools_of(first)

    async with Client(suite_server_http.url, read_timeout_seconds=TIMEOUT) as replay:
        tools = await tools_of(replay)
        assert set(tools) == {"slow_read", "slow_write", "multiply", "echo_headers", "fail"}
        assert hints(tools["multiply"]) == {"readOnlyHint": True}
        gone = await replay.call_tool("add", {"a": 1, "b": 1})
        assert gone.is_error and text(gone) == "Unknown tool: add"
        result = await replay.call_tool("multiply", {"a": 6, "b": 7})
        assert result.structured_content == {"result": 42}

    assert [c["tool"] for c in suite_files.calls()] == ["add", "multiply"]


async def test_suite_slow_tool_blocks_until_released(
    suite_server_http: HttpServerProcess, suite_files: SuiteFiles
) -> None:
    async with Client(suite_server_http.url, read_timeout_seconds=TIMEOUT) as client:
        call = asyncio.create_task(client.call_tool("slow_write", {"key": "k1"}))
        await asyncio.to_thread(suite_files.wait_for_calls, "slow_write")
        # Another call on the same connection is answered while slow_write still blocks.
        assert (await client.call_tool("add", {"a": 1, "b": 1})).structured_content == {"result": 2}
        assert not call.done()
        suite_files.release()
        result = await asyncio.wait_for(call, TIMEOUT)
        assert not result.is_error and text(result) == "slow_write done: k1"
    assert suite_files.count("slow_write") == 1


async def test_suite_server_behind_mcp_proxy(
    start_mcp_proxy: Any, suite_server_stdio: StdioServer, suite_files: SuiteFiles
) -> None:
    proxy: HttpServerProcess = start_mcp_proxy(suite_server_stdio)
    async with Client(proxy.url, read_timeout_seconds=TIMEOUT) as client:
        tools = await tools_of(client)
        assert hints(tools["slow_read"]) == {"readOnlyHint": True}
        assert tools["slow_write"].annotations is None
        result = await client.call_tool("add", {"a": 20, "b": 22})
        assert not result.is_error and text(result) == "42"
    assert suite_files.count("add") == 1

    processes, port = proxy.processes(), proxy.port
    assert len(processes) == 2  # the proxy and the suite server it launched, in another session
    proxy.stop()
    assert not any(map(pid_alive, processes))
    assert port_is_free(port)
