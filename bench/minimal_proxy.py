"""The least a Python hop in front of Restate can do, as a floor for the sidecar: a bare ASGI app
on uvicorn (uvloop, httptools, like the sidecar) that forwards `POST /v1/awakeables/{id}/resolve`
to the ingress with aiohttp and checks nothing (no signature, ledger or parked-call lookup).

    INGRESS=http://127.0.0.1:8080 uvicorn minimal_proxy:app --loop uvloop --http httptools
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp

INGRESS = os.environ["INGRESS"].rstrip("/")
_session: aiohttp.ClientSession | None = None


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _session
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        if _session is not None:
            await _session.close()
        await send({"type": "lifespan.shutdown.complete"})
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if _session is None:
        connector = aiohttp.TCPConnector(limit=200)
        _session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())
    awakeable = scope["path"].split("/")[3]
    url = f"{INGRESS}/restate/awakeables/{awakeable}/resolve"
    headers = {"content-type": "application/json"}
    async with _session.post(url, data=body, headers=headers) as response:
        status = 202 if response.status < 300 else 502
        await response.read()
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b""})
