"""Built-in tools, by the names a DurableAgent spec uses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ..base import ToolDef
from .files import (
    Workspace,
    append_file_tool,
    list_files_tool,
    read_file_tool,
    write_file_tool,
)

BuiltinFactory = Callable[[Workspace, str], ToolDef]

BUILTINS: dict[str, BuiltinFactory] = {
    "read_file": read_file_tool,
    "write_file": write_file_tool,
    "append_file": append_file_tool,
    "list_files": list_files_tool,
}


def file_tools(root: str | Path) -> list[ToolDef]:
    """The four file tools, confined to `root`."""
    workspace = Workspace(root)
    return [factory(workspace, name) for name, factory in BUILTINS.items()]


__all__ = ["BUILTINS", "Workspace", "file_tools"]
