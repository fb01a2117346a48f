"""HTTP/1.1 with the standard library, proxies ignored: how the local stack (`tether dev`,
`RestateServer`), `tether.testing` and the repository's tests talk to servers on loopback.

A status that is not 2xx is an answer, returned like any other, never raised.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")


def request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> Response:
    """One request, as it is."""
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(), dict(resp.headers.items()))
    except urllib.error.HTTPError as err:
        with err:
            return Response(err.code, err.read(), dict(err.headers.items()))


def request_json(
    method: str,
    url: str,
    payload: Any = None,
    *,
    raw: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> Response:
    """One request that sends `payload` as JSON (or `raw` bytes, as JSON) and accepts JSON."""
    body = raw if raw is not None else (None if payload is None else json.dumps(payload).encode())
    all_headers = {"accept": "application/json", **(headers or {})}
    if body is not None:
        all_headers.setdefault("content-type", "application/json")
    return request(method, url, body=body, headers=all_headers, timeout=timeout)
