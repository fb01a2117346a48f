"""`agent_service`'s app (`CrashAgent`, `CrashChild`) with room for many held tool bodies.

A body held by `tool_gate` waits in a thread of the event loop's default executor
(`asyncio.to_thread`): the executor in which the Restate SDK also runs every synchronous
`ctx.run` action, `ctx.time()` among them (the runtime's clock and the session store read it).
It has `cpu + 4` threads, six on 2 cores, and every leadership move leaves the cut attempt's body
waiting in its thread while the new attempt starts the body again. A handful of held runs then
fill the executor, and every other run in the worker stops at its next `ctx.time()` until a gate
opens. The cluster tests hold bodies across node losses, so this app gives the loop a larger
default executor before serving `agent_service`'s app, which it otherwise leaves as it is.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agent_service import app as agent_app

THREADS = 64
_sized: set[asyncio.AbstractEventLoop] = set()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    loop = asyncio.get_running_loop()
    if loop not in _sized:
        loop.set_default_executor(ThreadPoolExecutor(THREADS, thread_name_prefix="tools"))
        _sized.add(loop)
    await agent_app(scope, receive, send)
