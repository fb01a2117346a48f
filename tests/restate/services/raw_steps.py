"""A raw-SDK Restate service for the server tests (served with the hypercorn CLI).

Every side effect appends one line to the file named in the request, so a test can count what
ran, even across killed worker processes:

- ``enter``          each attempt of ``run`` (handler entry; replays write it again);
- ``start <i>``      the body of step ``i`` began;
- ``end <i>``        the body of step ``i`` finished (then its result is journaled);
- ``awakeable <id>`` the awakeable id, written by a journaled step of ``wait_for_awakeable``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import restate


def append_line(path: str, line: str) -> None:
    # O_APPEND with one small write: lines from concurrent or killed processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


async def step_body(path: str, index: int, step_seconds: float) -> int:
    append_line(path, f"start {index}")
    if step_seconds:
        await asyncio.sleep(step_seconds)
    append_line(path, f"end {index}")
    return index * index


def publish_awakeable(path: str, awakeable_id: str) -> None:
    append_line(path, f"awakeable {awakeable_id}")


steps = restate.VirtualObject("RawSteps")


@steps.handler()
async def run(ctx: restate.ObjectContext, req: dict[str, Any]) -> list[int]:
    """``{"path": str, "steps": int, "step_seconds": float = 0}``: run the steps in order."""
    path, step_seconds = str(req["path"]), float(req.get("step_seconds", 0.0))
    append_line(path, "enter")
    results: list[int] = []
    for i in range(int(req["steps"])):
        value = await ctx.run_typed(
            f"step {i}",
            step_body,
            restate.RunOptions(type_hint=int),
            path=path,
            index=i,
            step_seconds=step_seconds,
        )
        results.append(value)
    return results


@steps.handler()
async def wait_for_awakeable(ctx: restate.ObjectContext, req: dict[str, Any]) -> str:
    """``{"path": str}``: publish an awakeable id to the file, park until it is resolved."""
    awakeable_id, payload = ctx.awakeable(type_hint=str)
    await ctx.run_typed(
        "publish awakeable", publish_awakeable, path=str(req["path"]), awakeable_id=awakeable_id
    )
    value = await payload
    return f"resolved:{value}"


app = restate.app(services=[steps])
