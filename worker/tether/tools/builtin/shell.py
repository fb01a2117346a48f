"""`shell`: a command in a subprocess, with a timeout and an output cap."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ..base import ToolDef
from ..decorator import tool


class ShellConfig(BaseModel):
    """`config` of the shell built-in."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    timeout_seconds: float = Field(default=60, gt=0)
    max_output_bytes: int = Field(default=32 * 1024, gt=0)


def keep_tail(output: bytes, limit: int) -> str:
    """The last `limit` bytes, with a marker saying how many were dropped from the head."""
    if len(output) <= limit:
        return output.decode(errors="replace")
    dropped = len(output) - limit
    return f"[... {dropped} bytes dropped ...]\n" + output[-limit:].decode(errors="replace")


def kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def shell_tool(name: str, config: dict[str, Any], workdir: str | Path) -> ToolDef:
    settings = ShellConfig.model_validate(config)

    @tool(name=name)
    async def shell(command: Annotated[str, Field(description="A /bin/sh command line.")]) -> str:
        """Run a shell command in the workspace; returns its exit code and combined output."""
        process = await asyncio.create_subprocess_shell(
            command,
            cwd=workdir,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # its own process group, so a timeout kills all of it
        )
        try:
            output, _ = await asyncio.wait_for(process.communicate(), settings.timeout_seconds)
        except TimeoutError:
            kill_group(process.pid)
            await process.wait()
            return f"timed out after {settings.timeout_seconds:g} s (killed)"
        except asyncio.CancelledError:  # the run was aborted: leave nothing running
            kill_group(process.pid)
            raise
        return f"exit code {process.returncode}\n{keep_tail(output, settings.max_output_bytes)}"

    return shell
