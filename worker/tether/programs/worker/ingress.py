"""The worker's posts to Restate's ingress: its live events (`live`) and the tool results its
replicas hand each other (`handoff_client`)."""

from __future__ import annotations

import logging
from typing import Any

import httpx2

from ..restate_endpoints import Endpoints

log = logging.getLogger(__name__)


def answer_of(response: httpx2.Response | None) -> str:
    """What a post got back, for a log line or an error: no answer, or its status."""
    return "no answer" if response is None else f"status {response.status_code}"


class IngressPoster:
    """POSTs JSON through Restate's ingress, a cluster's nodes in turn (`Endpoints`). A post
    that gets no answer is dropped and logged, and the posts after it go on new connections: the
    pooled ones may lead to a lost node's pod, which answers nothing
    (`tether.programs.renewable_session`)."""

    def __init__(self, ingress_url: str, timeout: float) -> None:
        self.endpoints = Endpoints(ingress_url)
        self.timeout = timeout
        self._client: httpx2.AsyncClient | None = None
        self._retired: httpx2.AsyncClient | None = None

    async def post(self, path: str, body: Any, what: str) -> httpx2.Response | None:
        """POST `body` as JSON to `path`; None when no node answered (logged as `what`)."""
        if self._client is None:
            self._client = httpx2.AsyncClient(timeout=self.timeout, trust_env=False)
        client = self._client
        try:
            return await self.endpoints.call(
                lambda base: client.post(f"{base}{path}", json=body),
                (httpx2.ConnectError, httpx2.ConnectTimeout),
            )
        except httpx2.HTTPError as error:
            log.warning("%s: no answer (%s)", what, type(error).__name__)
            await self._renew(client)
            return None

    async def _renew(self, client: httpx2.AsyncClient) -> None:
        """New connections from now on; the client retired before `client` is closed (a post
        still on it is dropped, as a failed one is)."""
        if self._client is client:
            retired, self._retired, self._client = self._retired, client, None
            if retired is not None:
                await retired.aclose()

    async def close(self) -> None:
        for client in (self._retired, self._client):
            if client is not None:
                await client.aclose()
