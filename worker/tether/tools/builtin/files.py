"""File tools confined to a workspace directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from ..base import ToolDef, ToolError
from ..decorator import tool

MAX_READ_BYTES = 256 * 1024
RelativePath = Annotated[str, Field(description="Path relative to the workspace.")]


class Workspace:
    """A directory that tools may not leave (no absolute paths, no `..` escapes, no symlinks
    out)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

    def resolve(self, relative: str) -> Path:
        target = (self.root / relative).resolve()
        if target != self.root and self.root not in target.parents:
            raise ToolError(f"{relative!r} is outside the workspace")
        return target


def read_file_tool(workspace: Workspace, name: str = "read_file") -> ToolDef:
    @tool(name=name, replay="safe", concurrency_safe=True)
    async def read_file(path: RelativePath) -> str:
        """Read a text file from the workspace."""
        target = workspace.resolve(path)
        if not target.is_file():
            raise ToolError(f"no such file: {path}")
        data = target.read_bytes()[:MAX_READ_BYTES]
        return data.decode(errors="replace")

    return read_file


def write_file_tool(workspace: Workspace, name: str = "write_file") -> ToolDef:
    @tool(name=name)
    async def write_file(path: RelativePath, content: str) -> str:
        """Create or replace a text file in the workspace."""
        target = workspace.resolve(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return f"wrote {len(content.encode())} bytes to {path}"

    return write_file


def append_file_tool(workspace: Workspace, name: str = "append_file") -> ToolDef:
    @tool(name=name)
    async def append_file(path: RelativePath, content: str) -> str:
        """Append text to a file in the workspace (created if missing)."""
        target = workspace.resolve(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write(content)
        return f"appended {len(content.encode())} bytes to {path}"

    return append_file


def list_files_tool(workspace: Workspace, name: str = "list_files") -> ToolDef:
    @tool(name=name, replay="safe", concurrency_safe=True)
    async def list_files(path: RelativePath = ".") -> str:
        """List the files under a workspace directory (hidden files and folders left out)."""
        base = workspace.resolve(path)
        if not base.is_dir():
            raise ToolError(f"no such directory: {path}")
        relative = (p.relative_to(workspace.root) for p in base.rglob("*") if p.is_file())
        files = sorted(str(r) for r in relative if not any(x.startswith(".") for x in r.parts))
        return "\n".join(files) or "(empty)"

    return list_files
