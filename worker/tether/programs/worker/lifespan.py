"""The ASGI lifespan answered in front of Restate's app, which refuses lifespan scopes (hypercorn
reports that as an error at every start) and has nothing to start or stop."""

from __future__ import annotations

from typing import Any

ASGIApp = Any


def answering_lifespan(app: ASGIApp) -> ASGIApp:
    """`app` with lifespan startup and shutdown acknowledged here; other scopes pass through."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    return wrapped
