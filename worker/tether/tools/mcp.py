"""Tools from MCP servers (the `mcp` extra), journaled like any other tool.

An `MCPToolset` is listed at the start of each run in one journaled step, so a replay sees the
tools the run started with. A tool is safe to run again after a crash when the server marks it
`readOnlyHint` or `idempotentHint`; anything else is `replay="unsafe"`, so a call that a crash
cut off is reported as interrupted instead of being sent again. Server errors and timeouts are
tool results that name the server, never crashes. Each call carries its idempotency key in
`_meta` (`IDEMPOTENCY_KEY_META`). One connection serves all the calls of a run;
it opens at the first call (or the listing) and closes when the run ends, so a replay on a new
worker opens its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import functools
import json
import logging
import os
import re
import shutil
import ssl
import stat
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from .._optional import extra_imports
from ..messages import JSON, ImageBlock, TextBlock
from ..sandbox.config import SandboxConfig
from ..sandbox.launch import Launch, program_paths, refused_path_entries
from .base import ReplayPolicy, ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from .toolset import ToolsetError

with extra_imports("tether.tools.mcp", "mcp"):
    import httpx2
    from mcp import Client
    from mcp.client.sse import sse_client
    from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client
    from mcp.client.streamable_http import streamable_http_client

HttpTransport = Literal["streamable-http", "sse"]
CallObserver = Callable[[str, str, str, float], None]
"""Told of each live call: server, tool (the server's name for it), outcome (`ok`, `error`,
`timeout`, `unreachable`) and seconds. The worker counts them in its metrics."""

IDEMPOTENCY_KEY_META = "dev.tether/idempotency-key"
"""The `_meta` key of a call's idempotency key (`ToolContext.idempotency_key`): the same for
every attempt of one call, another for every other call. MCP has no field of its own for it;
`_meta` is where a request's extra data goes, under a prefix of the sender's."""
LIST_ATTEMPTS = 3
"""A server that restarts as the run starts gets a second and third chance (0.5 s, then 1 s
later) before the run fails."""
_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolOverride:
    """Settings of one tool of a server that win over the server's annotations."""

    replay: ReplayPolicy | None = None
    require_approval: bool | None = None
    description: str | None = None


@dataclass(frozen=True)
class MCPServer:
    """How to reach an MCP server, and which of its tools the agent gets."""

    name: str
    url: str | None = None
    """Streamable HTTP (or SSE) endpoint; or give `command` for a stdio server."""
    transport: HttpTransport = "streamable-http"
    """How to speak to `url`."""
    command: Sequence[str] = ()
    """argv of a stdio server; it gets only `env` and a safe minimum of the worker's
    environment (PATH, HOME...), never the worker's secrets."""
    env: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    """HTTP headers of every request (credentials: the worker reads them from Secrets)."""
    include: Sequence[str] = ()
    """Tool names (shell-style patterns) to take; empty: all."""
    exclude: Sequence[str] = ()
    prefix: str = ""
    """Put before each tool's name, for two servers with a tool of the same name."""
    timeout: float = 60.0
    """Seconds for one call, and for connecting and listing."""
    replay: ReplayPolicy | None = None
    """For every tool of the server, over its annotations."""
    require_approval: bool = False
    """Every call parks until a person decides (see `MCPToolset`'s `approval`)."""
    tools: Mapping[str, ToolOverride] = field(default_factory=dict)
    """Per tool, by the server's name for it."""
    sandbox: SandboxConfig | None = None
    """Confine a stdio server (`tether.sandbox`): it reads the system's directories, its own
    program (`launch.program_paths`) and the files its command names by absolute path; reads
    and writes the `workspace` and a home of its own (its working directory, `HOME` and
    `TMPDIR`), made for each connection and removed with it; connects over TCP to
    `connectPorts` only; holds no capability. None: unconfined (a spec's stdio servers are
    confined unless their `sandbox` says otherwise)."""
    workspace: str | None = None
    """The directory a confined stdio server reads and writes besides its home."""

    def __post_init__(self) -> None:
        if (self.url is None) == (not self.command):
            raise ValueError(f"MCP server {self.name!r}: give a url or a command, not both")

    @property
    def where(self) -> str:
        """The server for messages: its URL without credentials or query, or its program."""
        if self.url is None:
            return self.command[0]
        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}" + (
            parts.path
        )

    def takes(self, tool: str) -> bool:
        included = not self.include or any(fnmatch.fnmatchcase(tool, p) for p in self.include)
        return included and not any(fnmatch.fnmatchcase(tool, p) for p in self.exclude)


class _Connection:
    """One open MCP session, held by a task of its own: the SDK's transports are anyio
    contexts that must be closed by the task that opened them, and calls come from the run's
    steps, each maybe in a task of its own."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self._ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._task = asyncio.create_task(self._hold(), name=f"mcp:{server.name}")

    async def client(self) -> Client:
        return await asyncio.shield(self._ready)

    @property
    def broken(self) -> bool:
        return self._task.done()

    async def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self._task, 5)

    async def _hold(self) -> None:
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(Client(self._transport(stack), cache=None))
                self._ready.set_result(client)
                await self._closing.wait()
        except BaseException as error:  # handed to the call waiting for the connection
            if not self._ready.done():
                failure = error if isinstance(error, Exception) else ConnectionError("closed")
                self._ready.set_exception(failure)
            if not isinstance(error, Exception):
                raise

    def _transport(self, stack: AsyncExitStack) -> Any:
        server = self.server
        if server.command:
            return stdio_client(_stdio_parameters(server, stack))
        assert server.url is not None
        if server.transport == "sse":
            return sse_client(server.url, headers=dict(server.headers), timeout=server.timeout)
        http = httpx2.AsyncClient(
            headers=dict(server.headers),
            timeout=httpx2.Timeout(server.timeout, read=None),
            verify=_tls_context(),
        )
        stack.push_async_callback(http.aclose)
        return streamable_http_client(server.url, http_client=http)


def _homes() -> Path:
    """Where confined stdio servers' homes are made: `$XDG_CACHE_HOME/tether/mcp-home` (else
    `~/.cache/...`)."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # a relative one is to be ignored (XDG)
        cache = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "tether" / "mcp-home"


def _own_directory(path: Path) -> None:
    """Make `path` (mode 0700) or find it made: a directory of this user's, not a symlink,
    that no one else writes."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    found = path.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid() or found.st_mode & 0o022:
        raise ToolsetError(f"{path} is not a directory that only this user writes (a symlink?)")


def _new_home(server: MCPServer, workspace: Path | None) -> Path:
    """A home for one connection of a confined stdio server (mode 0700, with its `tmp`),
    beside no other: what a server writes there reaches no other run or session."""
    homes = _homes()
    resolved = Path(os.path.realpath(homes))
    if workspace is not None and (
        resolved.is_relative_to(workspace) or workspace.is_relative_to(resolved)
    ):
        raise ToolsetError(
            f"its home, under {homes}, and the workspace {workspace} overlap, so the agent's "
            "file tools could rewrite what the server runs: set XDG_CACHE_HOME or the "
            "workspace elsewhere"
        )
    homes.parent.parent.mkdir(parents=True, exist_ok=True)  # the user's cache
    for directory in (homes.parent, homes):
        _own_directory(directory)
    home = Path(tempfile.mkdtemp(prefix=f"{_TOOL_NAME.sub('_', server.name)}-", dir=homes))
    (home / "tmp").mkdir(mode=0o700)
    return home


_warned: set[str] = set()
"""The servers whose unenforced sandbox has been logged: once a process."""


def _stdio_parameters(server: MCPServer, stack: AsyncExitStack) -> StdioServerParameters:
    """How to start a stdio server: as its command says, or through the sandbox's launcher,
    its program found on PATH now, in a home of its own that `stack` removes."""
    argv, env, sandbox = list(server.command), dict(server.env), server.sandbox
    if sandbox is None:
        return StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    launched = {**get_default_environment(), **env}
    search_path = launched.get("PATH") or os.defpath
    workspace = None
    if server.workspace is not None:
        os.makedirs(server.workspace, exist_ok=True)
        workspace = Path(os.path.realpath(server.workspace))
    if refused := refused_path_entries(search_path, workspace):
        raise ToolsetError(
            f"its PATH holds {', '.join(map(repr, refused))}: a relative directory or one in "
            "the workspace, where the model could put a program of the same name"
        )
    found = shutil.which(argv[0], path=search_path)
    if found is None:
        raise ToolsetError(f"{argv[0]} is not found on its PATH ({search_path})")
    argv[0] = os.path.abspath(found)
    try:
        readable = program_paths(argv, sandbox.read_paths, search_path, workspace)
    except ValueError as error:
        raise ToolsetError(str(error)) from None
    home = _new_home(server, workspace)
    stack.callback(shutil.rmtree, home, ignore_errors=True)
    writable = [str(home), *([str(workspace)] if workspace else [])]
    policy = sandbox.policy(read=readable, write=writable)
    if unenforced := policy.unenforced:
        what = "; ".join(unenforced)
        if sandbox.required:
            raise ToolsetError(f"the sandbox is required and this kernel cannot confine {what}")
        if server.name not in _warned:
            _warned.add(server.name)
            log.warning("MCP server %s: the sandbox cannot confine %s", server.name, what)
    own = {"HOME": str(home), "TMPDIR": str(home / "tmp")}
    launch = Launch(policy, tuple(argv), str(home), {**launched, **own, **env})
    command, launcher_env = launch.command()
    return StdioServerParameters(command=command[0], args=command[1:], env=launcher_env, cwd="/")


class MCPToolset:
    """The tools of one MCP server, as a `Toolset`.

    `approval` wraps a tool whose calls wait for a person (the spec's `requireApproval`);
    `observe` is told of each live call; `wrap` is given each tool as made, before `approval`
    (`tether crashtest` counts the calls' bodies so).
    """

    def __init__(
        self,
        server: MCPServer,
        *,
        approval: Callable[[ToolDef], ToolDef] | None = None,
        observe: CallObserver | None = None,
        wrap: Callable[[ToolDef], ToolDef] | None = None,
    ) -> None:
        wants_approval = server.require_approval or any(
            o.require_approval for o in server.tools.values()
        )
        if wants_approval and approval is None:
            raise ValueError(
                f"MCP server {server.name!r}: approvals need the runtime's `approval` wrapper"
            )
        self.server = server
        self.name = server.name
        self._approval = approval
        self._observe = observe
        self._wrap = wrap
        self._connection: _Connection | None = None
        self._lock = asyncio.Lock()

    # Listing -------------------------------------------------------------------------------

    async def list_tools(self) -> JSON:
        server = self.server
        for attempt in range(LIST_ATTEMPTS):
            try:
                async with asyncio.timeout(server.timeout):
                    return await self._list_once()
            except Exception as error:
                await self._drop()
                if attempt + 1 == LIST_ATTEMPTS:
                    raise ToolsetError(
                        f"MCP server {server.name!r} ({server.where}) could not be listed "
                        f"after {LIST_ATTEMPTS} attempts: {_describe(error)}"
                    ) from None
                await asyncio.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    async def _list_once(self) -> JSON:
        client = await self._client()
        listed: list[JSON] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            for tool in page.tools:
                if not self.server.takes(tool.name):
                    continue
                wire = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
                hints = wire.get("annotations") or {}
                listed.append(
                    {
                        "name": tool.name,
                        "description": wire.get("description") or "",
                        "input_schema": wire.get("inputSchema") or {"type": "object"},
                        "read_only": bool(hints.get("readOnlyHint")),
                        "idempotent": bool(hints.get("idempotentHint")),
                    }
                )
            cursor = page.next_cursor
            if cursor is None:
                return listed

    # Tools ---------------------------------------------------------------------------------

    def tools(self, listing: JSON) -> list[ToolDef]:
        return [self._tool(entry) for entry in listing]

    def _tool(self, entry: dict[str, Any]) -> ToolDef:
        server = self.server
        remote = entry["name"]
        override = server.tools.get(remote, ToolOverride())
        safe = entry["read_only"] or entry["idempotent"]
        replay = override.replay or server.replay or ("safe" if safe else "unsafe")

        async def execute(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
            return await self.call(remote, arguments, idempotency_key=ctx.idempotency_key)

        tool = ToolDef(
            spec=ToolSpec(
                name=_TOOL_NAME.sub("_", server.prefix + remote)[:64],
                description=override.description or entry["description"],
                input_schema=entry["input_schema"],
            ),
            execute=execute,
            is_concurrency_safe=bool(entry["read_only"]),
            replay=replay,
        )
        if self._wrap is not None:
            tool = self._wrap(tool)
        approval = (
            override.require_approval
            if override.require_approval is not None
            else server.require_approval
        )
        if approval:
            assert self._approval is not None
            tool = self._approval(tool)
        return tool

    # Calls ---------------------------------------------------------------------------------

    async def call(
        self, tool: str, arguments: dict[str, Any], *, idempotency_key: str | None = None
    ) -> ToolOutput:
        """Call `tool` (the server's name for it): its output, or a `ToolError` naming the
        server. The call's idempotency key goes in the request's `_meta`
        (`IDEMPOTENCY_KEY_META`), where a server that acts once per key finds it."""
        server = self.server
        started = time.monotonic()
        outcome = "error"
        try:
            try:
                async with asyncio.timeout(server.timeout):
                    client = await self._client()
                    meta = {IDEMPOTENCY_KEY_META: idempotency_key} if idempotency_key else None
                    result = await client.call_tool(tool, arguments, meta=meta)  # type: ignore[arg-type]
            except TimeoutError:
                outcome = "timeout"
                await self._drop()  # the connection may hold a half-answered request
                raise ToolError(
                    f"MCP server {server.name!r}: {tool} timed out after {server.timeout:g} s"
                ) from None
            except ToolError:
                raise
            except Exception as error:
                outcome = "unreachable"
                await self._drop()
                raise ToolError(
                    f"MCP server {server.name!r} ({server.where}): {tool} failed: "
                    f"{_describe(error)}"
                ) from None
            wire = result.model_dump(mode="json", by_alias=True, exclude_none=True)
            output = _output(wire)
            if wire.get("isError"):
                text = output if isinstance(output, str) else _text_of(output)
                raise ToolError(f"MCP server {server.name!r}: {tool}: {text}")
            outcome = "ok"
            return output
        finally:
            if self._observe is not None:
                self._observe(server.name, tool, outcome, time.monotonic() - started)

    async def _client(self) -> Client:
        async with self._lock:
            if self._connection is None or self._connection.broken:
                if self._connection is not None:
                    await self._connection.close()
                self._connection = _Connection(self.server)
            connection = self._connection
        return await connection.client()

    async def _drop(self) -> None:
        async with self._lock:
            connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    async def aclose(self) -> None:
        await self._drop()


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context for every connection: building one loads the CA bundle, which
    took 20-70 ms of each run's first MCP call (bench/mcp_calls.py)."""
    return ssl.create_default_context()


def _describe(error: BaseException) -> str:
    """A short account of a connection failure (an anyio group's first real cause)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    text = str(error) or type(error).__name__
    return text if len(text) < 300 else text[:300] + "..."


def _output(result: dict[str, Any]) -> ToolOutput:
    """A `CallToolResult` (wire JSON) as a tool output: text and images as they are, other
    content described in text, structured content as JSON when there is nothing else."""
    blocks: list[TextBlock | ImageBlock] = []
    for item in result.get("content") or []:
        kind = item.get("type")
        if kind == "text":
            blocks.append({"type": "text", "text": item.get("text", "")})
        elif kind == "image":
            blocks.append(
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": item.get("mimeType", "image/png"),
                        "data": item.get("data", ""),
                    },
                }
            )
        elif kind == "resource":
            resource = item.get("resource") or {}
            text = resource.get("text")
            if text is None:
                text = f"[resource {resource.get('uri', '')} ({resource.get('mimeType', '?')})]"
            blocks.append({"type": "text", "text": text})
        elif kind == "resource_link":
            blocks.append({"type": "text", "text": f"[resource link: {item.get('uri', '')}]"})
        else:
            blocks.append({"type": "text", "text": f"[{kind} content ({item.get('mimeType')})]"})
    if not blocks and result.get("structuredContent") is not None:
        return json.dumps(result["structuredContent"])
    if all(b["type"] == "text" for b in blocks):
        return _text_of(blocks)
    return blocks


def _text_of(blocks: list[TextBlock | ImageBlock]) -> str:
    return "\n".join(b["text"] for b in blocks if b["type"] == "text")
