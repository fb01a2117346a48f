"""The test suite's own MCP server, written with the `mcp` SDK's `MCPServer`, run as a real process.

    python tests/mcp/suite_server.py --transport http --port 8123 --calls-log calls.jsonl \\
        --release release --tools-v2-marker v2
    python tests/mcp/suite_server.py --transport stdio --calls-log calls.jsonl ...

Over HTTP it serves streamable HTTP at http://127.0.0.1:<port>/mcp and answers `GET /health`
(200 once it listens). Every option also comes from the environment (`TETHER_MCP_SUITE_*` below);
the command line wins.

Tools (version 1 of the list):

- `slow_read` (readOnlyHint=true): blocks until the release file exists; after the block timeout
  it fails (an `isError` result).
- `slow_write` (no annotations: not safe to repeat): the same.
- `add` (readOnlyHint=true): a + b.
- `echo_headers` (readOnlyHint=true): the HTTP request headers it received, as a JSON object with
  lower-case names (`{}` over stdio).
- `fail` (no annotations): an `isError` result carrying the given message.

Once the `--tools-v2-marker` file exists, the server serves version 2 of the list: `add` is gone
(calling it gives the SDK's `isError` "Unknown tool: add") and `multiply` (readOnlyHint=true)
appears. The marker is read on every `tools/list` and `tools/call`, so a new connection, and an
open one that lists again, sees the list of the moment. `tools/list` results carry `ttlMs: 0`
(the SDK's default), so no `mcp` client caches them.

Every call whose body runs appends one JSON line `{"tool", "arguments", "time", "pid",
"idempotency_key"}` (the key from the request's `_meta`, else null) to the
calls log before doing anything else (a slow tool's line is there while it blocks), with one
`write` on an `O_APPEND` file, so lines from several server processes never interleave.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

ENV_CALLS_LOG = "TETHER_MCP_SUITE_CALLS_LOG"
ENV_RELEASE = "TETHER_MCP_SUITE_RELEASE"
ENV_TOOLS_V2_MARKER = "TETHER_MCP_SUITE_TOOLS_V2_MARKER"
ENV_BLOCK_TIMEOUT = "TETHER_MCP_SUITE_BLOCK_TIMEOUT"

IDEMPOTENCY_KEY_META = "dev.tether/idempotency-key"
CALL_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("call_key", default=None)
"""The idempotency key in the `_meta` of the request whose tool runs (`record` logs it)."""

DEFAULT_BLOCK_TIMEOUT = 60.0
RELEASE_POLL_INTERVAL = 0.02

TOOLS_V1 = frozenset({"slow_read", "slow_write", "add", "echo_headers", "fail"})
TOOLS_V2 = frozenset({"slow_read", "slow_write", "multiply", "echo_headers", "fail"})

READ_ONLY = ToolAnnotations(read_only_hint=True)


class SuiteServer(MCPServer[Any]):
    """An `MCPServer` whose tool list is version 1 or 2, chosen by a marker file per request."""

    def __init__(
        self,
        *,
        calls_log: Path | None,
        release: Path | None,
        tools_v2_marker: Path | None,
        block_timeout: float,
    ) -> None:
        super().__init__("tether-suite", version="1", log_level="INFO")
        self.calls_log = calls_log
        self.release = release
        self.tools_v2_marker = tools_v2_marker
        self.block_timeout = block_timeout

    def tool_names(self) -> frozenset[str]:
        if self.tools_v2_marker is not None and self.tools_v2_marker.exists():
            return TOOLS_V2
        return TOOLS_V1

    async def list_tools(self) -> Any:
        names = self.tool_names()
        return [tool for tool in await super().list_tools() if tool.name in names]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> Any:
        if name not in self.tool_names():
            raise ToolError(f"Unknown tool: {name}")
        meta = (context.request_context.meta if context is not None else None) or {}
        token = CALL_KEY.set(meta.get(IDEMPOTENCY_KEY_META))
        try:
            return await super().call_tool(name, arguments, context)
        finally:
            CALL_KEY.reset(token)

    def record(self, tool: str, arguments: dict[str, Any]) -> None:
        if self.calls_log is None:
            return
        record = {"tool": tool, "arguments": arguments, "time": time.time(), "pid": os.getpid()}
        record["idempotency_key"] = CALL_KEY.get()
        line = json.dumps(record, sort_keys=True)
        fd = os.open(self.calls_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    async def block(self, tool: str, key: str) -> CallToolResult:
        """Wait for the release file (polled), then answer; after the timeout, an error."""
        deadline = time.monotonic() + self.block_timeout
        while self.release is None or not self.release.exists():
            if time.monotonic() >= deadline:
                return error_result(
                    f"{tool}({key!r}): the release file {self.release} did not appear "
                    f"within {self.block_timeout:g}s"
                )
            await anyio.sleep(RELEASE_POLL_INTERVAL)
        return CallToolResult(content=[TextContent(type="text", text=f"{tool} done: {key}")])


def error_result(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def build_server(
    *,
    calls_log: Path | None,
    release: Path | None,
    tools_v2_marker: Path | None,
    block_timeout: float,
) -> SuiteServer:
    server = SuiteServer(
        calls_log=calls_log,
        release=release,
        tools_v2_marker=tools_v2_marker,
        block_timeout=block_timeout,
    )

    @server.tool(annotations=READ_ONLY)
    async def slow_read(key: str = "") -> CallToolResult:
        """Read something slowly: blocks until the test releases it."""
        server.record("slow_read", {"key": key})
        return await server.block("slow_read", key)

    @server.tool()
    async def slow_write(key: str = "") -> CallToolResult:
        """Write something slowly: blocks until the test releases it. Not safe to repeat."""
        server.record("slow_write", {"key": key})
        return await server.block("slow_write", key)

    @server.tool(annotations=READ_ONLY)
    def add(a: int, b: int) -> int:
        """Add two integers."""
        server.record("add", {"a": a, "b": b})
        return a + b

    @server.tool(annotations=READ_ONLY)
    def multiply(a: int, b: int) -> int:
        """Multiply two integers (only in version 2 of the tool list)."""
        server.record("multiply", {"a": a, "b": b})
        return a * b

    @server.tool(annotations=READ_ONLY)
    def echo_headers(ctx: Context[Any, Any]) -> str:
        """The HTTP headers of this request, as a JSON object with lower-case names."""
        server.record("echo_headers", {})
        headers = ctx.headers
        return json.dumps({k.lower(): v for k, v in (headers or {}).items()}, sort_keys=True)

    @server.tool()
    def fail(message: str = "this tool always fails") -> CallToolResult:
        """Always fails: an isError result carrying `message`."""
        server.record("fail", {"message": message})
        return error_result(message)

    @server.custom_route("/health", methods=["GET"])  # type: ignore[untyped-decorator]
    async def health(_: Request) -> Response:
        return PlainTextResponse("ok")

    return server


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="required with --transport http")
    parser.add_argument("--calls-log", default=os.environ.get(ENV_CALLS_LOG))
    parser.add_argument("--release", default=os.environ.get(ENV_RELEASE))
    parser.add_argument("--tools-v2-marker", default=os.environ.get(ENV_TOOLS_V2_MARKER))
    parser.add_argument(
        "--block-timeout",
        type=float,
        default=float(os.environ.get(ENV_BLOCK_TIMEOUT) or DEFAULT_BLOCK_TIMEOUT),
        help="seconds a slow tool waits for the release file before failing",
    )
    args = parser.parse_args(argv)
    server = build_server(
        calls_log=_path(args.calls_log),
        release=_path(args.release),
        tools_v2_marker=_path(args.tools_v2_marker),
        block_timeout=args.block_timeout,
    )
    if args.transport == "stdio":
        server.run("stdio")
        return
    if not args.port:
        parser.error("--transport http needs --port")
    print(f"tether-suite MCP server on http://{args.host}:{args.port}/mcp", file=sys.stderr)
    server.run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
