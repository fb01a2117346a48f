"""Tests against real MCP servers: the pinned PyPI servers (scripts/install-mcp-servers.sh),
`mcp-proxy` for streamable HTTP, and the suite's own server (suite_server.py)."""
