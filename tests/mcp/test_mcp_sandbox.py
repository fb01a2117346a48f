"""A spec's stdio MCP servers run confined (`tether.sandbox`, through its launcher): a server
that does what the model asks reaches neither the files beside the workspace nor a loopback port
that stands for Restate's ingress, and writes only the workspace and a home of its own; its
credentials come from Secrets, to it alone. Real processes: the suite's deputy server
(`deputy_server.py`) and `mcp-server-fetch` from PyPI."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mcp.servers import LOOPBACK, LoopbackSite, StdioServer
from tether.sandbox import landlock
from tether.sandbox.config import SYSTEM_PATHS
from tether.spec import SpecError, parse_agent
from tether.spec.assemble import SpecTools
from tether.tools import ToolError
from tether.tools.mcp import MCPToolset
from tether.tools.toolset import ToolsetError

DEPUTY = Path(__file__).resolve().with_name("deputy_server.py")

pytestmark = pytest.mark.skipif(
    landlock.abi_version() < 6, reason="the kernel's Landlock is older than ABI 6 (Linux 6.12)"
)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port listening on loopback, standing for Restate's ingress."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen(8)
        yield sock.getsockname()[1]


def document(mcp: dict[str, Any], *more_tools: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "sandboxed"},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": [{"text": "done"}]},
            "tools": [{"name": "deputy", "mcp": mcp}, *more_tools],
        },
    }


def toolset(tmp_path: Path, mcp: dict[str, Any], env: dict[str, str] | None = None) -> MCPToolset:
    """The toolset of a spec with the one stdio server `mcp`, its workspace tmp_path/ws, the
    worker's environment `env`."""
    spec = parse_agent(document(mcp)).spec
    (found,) = SpecTools(spec, tmp_path / "ws", env=env).for_run()
    assert isinstance(found, MCPToolset)
    return found


async def calls(toolset: MCPToolset, *asked: tuple[str, dict[str, Any]]) -> list[str]:
    """Each call's output, or its error's text."""
    tools = {tool.spec.name: tool for tool in toolset.tools(await toolset.list_tools())}
    results = []
    try:
        for name, arguments in asked:
            try:
                results.append(str(await toolset.call(name, arguments)))
            except ToolError as error:
                results.append(f"error: {error}")
    finally:
        await toolset.aclose()
    assert tools
    return results


DEPUTY_COMMAND = [sys.executable, str(DEPUTY)]


def permissions(path: Path) -> int | None:
    """The permission bits of `path`, None once it is gone."""
    return path.stat().st_mode & 0o777 if path.exists() else None


async def test_a_confined_deputy_reaches_only_the_workspace_and_its_home(
    tmp_path: Path, listener: int, cache_home: Path
) -> None:
    secret = tmp_path / "beside-the-workspace"
    secret.write_text("the worker's")
    bashrc = Path.home() / ".bashrc"
    deputy = toolset(tmp_path, {"command": DEPUTY_COMMAND})
    await deputy.list_tools()
    home = Path(str(await deputy.call("env", {"name": "HOME"})))
    assert home.parent == cache_home / "tether" / "mcp-home"
    assert permissions(home) == 0o700
    asked = [
        ("read", {"path": str(secret)}),
        ("write", {"path": str(tmp_path / "planted"), "text": "x"}),
        ("write", {"path": "/tmp/planted-by-the-deputy", "text": "x"}),
        ("connect", {"port": listener}),
        ("read", {"path": f"/proc/{os.getpid()}/environ"}),  # the worker's secrets
        ("read", {"path": str(bashrc)}),
        ("write", {"path": str(tmp_path / "ws" / "notes.txt"), "text": "kept"}),
        ("write", {"path": "cache.txt", "text": "kept"}),  # its working directory: its home
        ("read", {"path": str(home / "cache.txt")}),
        ("env", {"name": "TMPDIR"}),
        ("read", {"path": str(DEPUTY)}),
    ]
    results = await calls(deputy, *asked)
    refused = ("Permission denied", "No such file")  # ~/.bashrc may not be there at all
    assert all(any(r in result for r in refused) for result in results[:6]), results[:6]
    assert results[6:10] == [
        f"wrote {tmp_path / 'ws' / 'notes.txt'}",
        "wrote cache.txt",
        "kept",
        str(home / "tmp"),
    ]
    assert "confused deputy" in results[10]  # the files its command names
    assert not (tmp_path / "planted").exists()
    assert permissions(home) is None  # gone with its connection

    # What the sandbox stands between: unconfined, the same server reaches all of it.
    unconfined = {"command": DEPUTY_COMMAND, "sandbox": {"enabled": False}}
    results = await calls(toolset(tmp_path, unconfined), *asked[:2], asked[3])
    assert results == ["the worker's", f"wrote {tmp_path / 'planted'}", f"connected to {listener}"]


async def test_what_a_server_writes_in_its_home_reaches_no_later_run(tmp_path: Path) -> None:
    """A compromised server could plant code in its home (a `.pth`, an npm cache) for the
    next session's server to run: each connection gets a fresh home."""
    first, second = (toolset(tmp_path, {"command": DEPUTY_COMMAND}) for _ in range(2))
    home, wrote = await calls(
        first, ("env", {"name": "HOME"}), ("write", {"path": "planted.pth", "text": "x"})
    )
    later, found = await calls(second, ("env", {"name": "HOME"}), ("read", {"path": "planted.pth"}))
    assert wrote == "wrote planted.pth" and later != home and "No such file" in found


async def test_a_module_planted_in_the_workspace_does_not_replace_the_servers(
    tmp_path: Path,
) -> None:
    """The model writes the workspace (file tools, `shell`); a server that loads code from its
    working directory (`python -m`, npx, uv) would load the model's: its working directory is
    its home, which no other tool writes."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    planted = tmp_path / "planted-module-ran"
    (workspace / "deputy_server.py").write_text(f"open({str(planted)!r}, 'w')\n")
    readable = {"readPaths": [*SYSTEM_PATHS, str(DEPUTY.parent)]}
    mcp = {
        "command": [sys.executable, "-m", "deputy_server"],
        "env": [{"name": "PYTHONPATH", "value": str(DEPUTY.parent)}],
        "sandbox": readable,
    }
    (home,) = await calls(toolset(tmp_path, mcp), ("env", {"name": "HOME"}))
    assert home.startswith(str(tmp_path / "cache")) and not planted.exists()


async def test_a_program_in_the_workspace_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model writes the workspace: a program there, or the interpreter a program names,
    would be the model's code holding the server's credentials."""
    monkeypatch.setattr("tether.tools.mcp.LIST_ATTEMPTS", 1)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    inside = workspace / "server"
    inside.write_text("#!/bin/sh\n")
    outside = tmp_path / "server"
    outside.write_text(f"#!{workspace / 'python'}\n")
    for program in (inside, outside):
        program.chmod(0o755)
        with pytest.raises(ToolsetError, match="is in the workspace"):
            await toolset(tmp_path, {"command": [str(program)]}).list_tools()


async def test_homes_under_a_symlink_another_can_write_or_the_workspace_are_refused(
    tmp_path: Path, cache_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A symlink planted where the homes go would give the server what it points to; a
    directory others write, a home they could swap."""
    monkeypatch.setattr("tether.tools.mcp.LIST_ATTEMPTS", 1)
    homes = cache_home / "tether" / "mcp-home"
    homes.parent.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    homes.symlink_to(outside)
    with pytest.raises(ToolsetError, match="is not a directory that only this user writes"):
        await toolset(tmp_path, {"command": DEPUTY_COMMAND}).list_tools()
    assert list(outside.iterdir()) == []
    homes.unlink()
    homes.mkdir(mode=0o777)
    homes.chmod(0o777)
    with pytest.raises(ToolsetError, match="is not a directory that only this user writes"):
        await toolset(tmp_path, {"command": DEPUTY_COMMAND}).list_tools()

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "ws" / ".cache"))
    with pytest.raises(ToolsetError, match="overlap"):
        await toolset(tmp_path, {"command": DEPUTY_COMMAND}).list_tools()


async def test_a_path_the_model_could_fill_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program the server runs by name later is found on its PATH: not in the workspace, not
    relative to its working directory."""
    monkeypatch.setattr("tether.tools.mcp.LIST_ATTEMPTS", 1)
    for path in (f"{tmp_path / 'ws' / 'node_modules' / '.bin'}:/usr/bin:/bin", "bin:/usr/bin"):
        mcp = {"command": DEPUTY_COMMAND, "env": [{"name": "PATH", "value": path}]}
        with pytest.raises(ToolsetError, match="its PATH holds"):
            await toolset(tmp_path, mcp).list_tools()


async def test_the_sandboxs_settings_open_a_path_and_a_port(tmp_path: Path, listener: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    sandbox = {"writePaths": [str(shared)], "connectPorts": [listener]}
    mcp = {"command": DEPUTY_COMMAND, "sandbox": sandbox}
    results = await calls(
        toolset(tmp_path, mcp),
        ("write", {"path": str(shared / "out"), "text": "x"}),
        ("connect", {"port": listener}),
    )
    assert results == [f"wrote {shared / 'out'}", f"connected to {listener}"]


async def test_a_published_fetch_server_cannot_fetch_a_loopback_port_unless_given_it(
    tmp_path: Path, fetch_server_stdio: StdioServer, loopback_site: LoopbackSite
) -> None:
    """`mcp-server-fetch --allow-private-ips` fetches what the model names; confined, a page on
    a loopback port (Restate's ingress, the worker's port) is out of its reach."""
    command = list(fetch_server_stdio.argv)
    port = int(loopback_site.url.split(":")[2].split("/")[0])
    asked = ("fetch", {"url": loopback_site.url})
    before = len(loopback_site.paths)
    (refused,) = await calls(toolset(tmp_path, {"command": command}), asked)
    assert refused.startswith("error: ") and "Failed to fetch" in refused, refused
    assert loopback_site.paths[before:] == []  # no connection reached the site
    given = {"command": command, "sandbox": {"connectPorts": [port]}}
    (fetched,) = await calls(toolset(tmp_path, given), asked)
    assert "forty-two" in fetched, fetched
    assert loopback_site.paths[before:] == ["/page.html"]


async def test_a_required_sandbox_the_kernel_cannot_give_fails_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(landlock, "abi_version", lambda: 0)  # a kernel without Landlock
    mcp = {"command": DEPUTY_COMMAND, "sandbox": {"required": True}}
    found = toolset(tmp_path, mcp)
    monkeypatch.setattr("tether.tools.mcp.LIST_ATTEMPTS", 1)
    with pytest.raises(Exception, match="the sandbox is required and this kernel cannot"):
        await found.list_tools()


async def test_a_stdio_servers_credential_comes_from_a_secret_to_that_server_alone(
    tmp_path: Path,
) -> None:
    """A credential in `env` comes from a Secret through the worker's environment (the operator
    maps it in as TETHER_MCP_<TOOL>_<NAME>), never in plain text, and no command gets it."""
    secret = {"name": "API_TOKEN", "secretRef": {"name": "deputy", "key": "token"}}
    mcp = {
        "command": [sys.executable, str(DEPUTY)],
        "env": [secret, {"name": "REGION", "value": "eu"}],
    }
    with pytest.raises(SpecError, match="TETHER_MCP_DEPUTY_API_TOKEN is not set"):
        toolset(tmp_path, mcp, env={})
    worker_env = {"TETHER_MCP_DEPUTY_API_TOKEN": "t0ken"}
    results = await calls(
        toolset(tmp_path, mcp, env=worker_env),
        ("env", {"name": "API_TOKEN"}),
        ("env", {"name": "REGION"}),
        ("env", {"name": "TETHER_MCP_DEPUTY_API_TOKEN"}),
    )
    assert results == ["t0ken", "eu", ""]

    plain = {"command": ["x"], "env": [{"name": "GITHUB_TOKEN", "value": "ghp_1"}]}
    with pytest.raises(SpecError, match="GITHUB_TOKEN carries a credential"):
        parse_agent(document(plain))
    shell = {
        "name": "sh",
        "builtin": "shell",
        "config": {"passEnv": ["TETHER_MCP_DEPUTY_API_TOKEN"]},
    }
    with pytest.raises(SpecError, match="TETHER_MCP_DEPUTY_API_TOKEN holds a secret"):
        parse_agent(document(mcp, shell))
    # The worker's own secrets are never sent to a server, by a variable or a header.
    for own in ("TETHER_WEBHOOK_SECRET", "ANTHROPIC_API_KEY"):
        taken = {"command": ["x"], "env": [{"name": "T", "env": own}]}
        with pytest.raises(SpecError, match=f"{own} is a secret of the worker's own"):
            parse_agent(document(taken))
    header = {"name": "Authorization", "env": "TETHER_WEBHOOK_SECRET"}
    with pytest.raises(SpecError, match="is a secret of the worker's own"):
        parse_agent(document({"url": "http://m/mcp", "headers": [header]}))
