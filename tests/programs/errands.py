"""The errands both crash matrices run (SQLite: crash_agent.py; Restate: agent_service.py): a
script of 8 model turns over three tools, and the tools themselves.

`charge` and `notify` are side effects that must not repeat (`notify` may run beside others);
`lookup` is safe to repeat. Each body first calls `record(name, ctx)`, which writes the effect
(and may kill the process: the matrices crash inside tool bodies that way).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from tether import ToolContext, ToolDef, tool

SCRIPT: list[dict[str, Any]] = [
    {"text": "start", "tool_calls": [{"name": "charge", "input": {"amount": 1}}]},
    {"tool_calls": [{"name": "lookup", "input": {"key": "a"}}]},
    {
        "tool_calls": [
            {"name": "lookup", "input": {"key": "b"}},
            {"name": "lookup", "input": {"key": "c"}},
            {"name": "notify", "input": {"to": "ops"}},
        ]
    },
    {"tool_calls": [{"name": "charge", "input": {"amount": 2}}]},
    {
        "tool_calls": [
            {"name": "notify", "input": {"to": "dev"}},
            {"name": "notify", "input": {"to": "qa"}},
        ]
    },
    {"tool_calls": [{"name": "lookup", "input": {"key": "d"}}]},
    {"tool_calls": [{"name": "charge", "input": {"amount": 3}}]},
    {"text": "all done"},
]

Record = Callable[[str, ToolContext], Awaitable[None]]


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def effect(path: str | os.PathLike[str], line: str) -> None:
    # O_APPEND with one small write: lines from concurrent or killed processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


def errand_tools(record: Record) -> list[ToolDef]:
    @tool
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charges a card (a side effect that must not repeat)."""
        await record("charge", ctx)
        return f"charged {amount}"

    @tool(concurrency_safe=True)
    async def notify(to: str, ctx: ToolContext) -> str:
        """Sends a notification (not safe to repeat)."""
        await record("notify", ctx)
        return f"notified {to}"

    @tool(replay="safe", concurrency_safe=True)
    async def lookup(key: str, ctx: ToolContext) -> str:
        """Reads a value (safe to repeat)."""
        await record("lookup", ctx)
        return f"value of {key}"

    return [charge, notify, lookup]
