"""The built-in tools, run for real: a local HTTP server, real subprocesses."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tether.tools import ToolError
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
