"""Built-in tools, by the names a DurableAgent spec uses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base import ToolDef
from .files import (
    Workspace,
    append_file_tool,
    list_files_tool,
    read_file_tool,
    write_file_tool,
)
from .http import http_request_tool
from .shell import shell_tool

BuiltinFactory = Callable[[str, dict[str, Any], Workspace], ToolDef]


def _no_config(factory: Callable[[Workspace, str], ToolDef]) -> BuiltinFactory:
    def build(name: str, config: dict[str, Any], workspace: Workspace) -> ToolDef:
        if config:
            raise ValueError(f"takes no config, got {', '.join(sorted(config))}")
        return factory(workspace, name)

    return build


BUILTINS: dict[str, BuiltinFactory] = {
    "read_file": _no_config(read_file_tool),
    "write_file": _no_config(write_file_tool),
    "append_file": _no_config(append_file_tool),
    "list_files": _no_config(list_files_tool),
    "http_request": lambda name, config, _: http_request_tool(name, config),
    "shell": lambda name, config, workspace: shell_tool(name, config, workspace.root),
}
"""Built-ins that run anywhere; `ask_human` needs a runtime that can park (Restate)."""


def file_tools(root: str | Path) -> list[ToolDef]:
    """The four file tools, confined to `root`."""
    workspace = Workspace(root)
    names = ("read_file", "write_file", "append_file", "list_files")
    return [BUILTINS[name](name, {}, workspace) for name in names]


__all__ = ["BUILTINS", "Workspace", "file_tools"]
