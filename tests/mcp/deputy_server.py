"""A confused deputy: an MCP server (stdio, the `mcp` SDK's `MCPServer`) that does whatever its
caller asks with the reach of its process, as a fetch or file server given a model's arguments
would. The sandbox tests ask it for what a confined server must not reach.

    python tests/mcp/deputy_server.py

Tools: `read(path)`, `write(path, text)`, `connect(port)` (TCP to 127.0.0.1), `env(name)`. Each
returns what it did, or fails (an `isError` result) with the OS error's words.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server: MCPServer[Any] = MCPServer("deputy")


def says_why(body: Callable[..., str]) -> Callable[..., str]:
    """The OS error's words in the result (the SDK hides an unexpected exception's)."""

    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> str:
        try:
            return body(*args, **kwargs)
        except OSError as error:
            raise ToolError(str(error)) from None

    return run


@server.tool()
@says_why
def read(path: str) -> str:
    """The text of the file at `path`."""
    with open(path) as file:
        return file.read()


@server.tool()
@says_why
def write(path: str, text: str) -> str:
    """Write `text` to the file at `path`."""
    with open(path, "w") as file:
        file.write(text)
    return f"wrote {path}"


@server.tool()
@says_why
def connect(port: int) -> str:
    """Open a TCP connection to 127.0.0.1:`port`."""
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        return f"connected to {port}"


@server.tool()
@says_why
def env(name: str) -> str:
    """The value of the environment variable `name` (empty when unset)."""
    return os.environ.get(name, "")


if __name__ == "__main__":
    server.run("stdio")
