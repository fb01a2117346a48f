"""The worker's own `/metrics`, on a port of its own (`tether worker --metrics-port`).

Hypercorn binds that port next to Restate's, and a request is routed by the port it came in on
(the ASGI scope's `server`): on the metrics port only `GET /metrics` is answered (404 for
anything else), and Restate's endpoint, which refuses whatever Restate did not sign, is never
reached from there; on Restate's port every request goes to that endpoint, `/metrics` included.
So Prometheus needs no signature, and nothing but the metrics is open without one.

With `PROMETHEUS_MULTIPROC_DIR` the answer merges the files of every process that writes there
(each hypercorn process answers with the whole worker's values); without it, this process's own.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from ..metrics import merged_files, multiprocess_dir

ASGIApp = Any


def metrics_registry() -> CollectorRegistry:
    """What a scrape exports: the merged files, else the default registry."""
    directory = multiprocess_dir()
    if directory is None:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    registry.register(merged_files(directory))
    return registry


def with_metrics_port(app: ASGIApp, port: int) -> ASGIApp:
    """`app` on every port but `port`, where only `GET /metrics` is served."""
    registry = metrics_registry()

    async def routed(scope: dict[str, Any], receive: Any, send: Any) -> None:
        server = scope.get("server")
        if scope["type"] == "lifespan" or not server or server[1] != port:
            await app(scope, receive, send)
        elif scope["type"] != "http":
            await send({"type": "websocket.close"})
        elif scope["method"] == "GET" and scope["path"] == "/metrics":
            # Reading the files blocks: not on the loop that runs the invocations.
            body = await asyncio.to_thread(generate_latest, registry)
            await _respond(send, 200, body, CONTENT_TYPE_LATEST)
        else:
            await _respond(send, 404, b"not found: only GET /metrics here\n", "text/plain")

    return routed


async def _respond(send: Any, status: int, body: bytes, content_type: str) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
