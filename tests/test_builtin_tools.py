"""The built-in tools, run for real: a local HTTP server, real subprocesses."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tether.spec import DurableAgentSpec, SpecError, ToolSpecEntry
from tether.spec.assemble import ParkingTool, SpecTools
from tether.tools import ToolContext, ToolDef, ToolError, ToolSpec
from tether.tools.builtin import BUILTINS, Workspace
from tether.tools.builtin.http import host_allowed


class Echo(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = ("x" * 100 if self.path == "/big" else f"hello {self.path}").encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def build(name: str, config: dict[str, Any], root: Path) -> Any:
    return BUILTINS[name](name, config, Workspace(root))


def loopback(url: str) -> dict[str, Any]:
    """The config that lets http_request call a test server on loopback at `url`'s port."""
    return {"allowCidrs": ["127.0.0.0/8", "::1/128"], "allowPorts": [int(url.rsplit(":", 1)[1])]}


async def test_http_request_reaches_allowed_hosts_only(server: str, tmp_path: Path) -> None:
    config = {"allowHosts": ["127.0.0.1"], "maxResponseBytes": 10, **loopback(server)}
    fetch = build("http_request", config, tmp_path)
    assert await fetch.execute({"url": f"{server}/hi"}, None) == "HTTP 200\nhello /hi"
    assert (await fetch.execute({"url": f"{server}/big"}, None)).endswith(
        "[... 90 more bytes not shown ...]"
    )
    with pytest.raises(ToolError, match=r"'example\.com' is not an allowed host"):
        await fetch.execute({"url": "https://example.com/"}, None)


def test_host_patterns() -> None:
    assert host_allowed("https://api.example.com/x", ["*.example.com"])
    assert not host_allowed("https://example.com.evil.org/", ["*.example.com"])
    assert not host_allowed("file:///etc/passwd", ["*"])
    assert not host_allowed("https://user@evil.org/", ["example.com"])


def test_http_request_needs_an_allow_list(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowHosts"):
        build("http_request", {}, tmp_path)


async def test_shell_runs_in_the_workspace_with_a_capped_output(tmp_path: Path) -> None:
    shell = build("shell", {"maxOutputBytes": 20}, tmp_path)
    (tmp_path / "marker").write_text("here")
    assert await shell.execute({"command": "cat marker; exit 3"}, None) == "exit code 3\nhere"
    long = await shell.execute({"command": "seq 1 1000"}, None)
    assert long.startswith("exit code 0\n[... ") and long.endswith("999\n1000\n")


async def test_shell_kills_the_whole_command_on_timeout(tmp_path: Path) -> None:
    shell = build("shell", {"timeoutSeconds": 0.5}, tmp_path)
    started = time.monotonic()
    result = await shell.execute({"command": "sleep 30 & sleep 30; echo never"}, None)
    assert result == "timed out after 0.5 s (killed)"
    assert time.monotonic() - started < 10


def test_file_tools_take_no_config(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="takes no config"):
        build("read_file", {"root": "/"}, tmp_path)


def test_a_specs_tools_are_built_once_and_its_waits_per_run(tmp_path: Path) -> None:
    # A built-in's input model and schema cost ~0.5 ms to make: the worker builds them once,
    # and what waits for a person is bound to each run's own parking.
    spec = DurableAgentSpec.model_validate(
        {
            "model": {"provider": "scripted", "name": "s", "script": [{"text": "hi"}]},
            "tools": [
                {"name": "list_files", "builtin": "list_files"},
                {"name": "write_file", "builtin": "write_file", "requireApproval": True},
                {"name": "ask", "builtin": "ask_human"},
            ],
        }
    )
    tools = SpecTools(spec, tmp_path)

    def parking_of(run: str) -> ParkingTool:
        def parking(entry: ToolSpecEntry, inner: ToolDef | None) -> ToolDef:
            assert (inner is None) == (entry.builtin == "ask_human")
            return ToolDef(ToolSpec(f"{run}:{entry.name}", "parked", {}), execute=never)

        return parking

    first, second = tools.for_run(parking_of("a")), tools.for_run(parking_of("b"))
    assert first[0] is second[0] and first[0].name == "list_files"
    assert [t.name for t in first[1:]] == ["a:write_file", "a:ask"]
    assert [t.name for t in second[1:]] == ["b:write_file", "b:ask"]
    with pytest.raises(SpecError, match="wait for a person"):
        tools.for_run(None)


async def never(arguments: dict[str, Any], ctx: ToolContext) -> str:
    raise AssertionError("not called")
