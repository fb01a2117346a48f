"""The sidecar's calls to Restate: awakeable completion through the ingress, SQL through the
admin API, and the ingress health check. Failures become `Rejection`s (502/503)."""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx2

from .rejection import Rejection

log = logging.getLogger("tether.sidecar")


class RestateClient:
    def __init__(self, http: httpx2.AsyncClient, ingress_url: str, admin_url: str) -> None:
        self._http = http
        self._ingress = ingress_url.rstrip("/")
        self._admin = admin_url.rstrip("/")

    async def _post(self, url: str, body: bytes, content_type: str, what: str) -> httpx2.Response:
        try:
            return await self._http.post(
                url,
                content=body,
                headers={"content-type": content_type, "accept": "application/json"},
            )
        except httpx2.HTTPError as error:
            log.warning("%s: Restate did not answer: %s", what, type(error).__name__)
            raise Rejection(503, "restate_unavailable", "Restate is not reachable") from None

    async def _complete(self, awakeable_id: str, verb: str, body: bytes, content_type: str) -> None:
        url = f"{self._ingress}/restate/awakeables/{awakeable_id}/{verb}"
        response = await self._post(url, body, content_type, f"{verb} {awakeable_id}")
        if not response.is_success:
            log.warning(
                "%s %s: Restate answered HTTP %s: %s",
                verb,
                awakeable_id,
                response.status_code,
                response.text[:300],
            )
            raise Rejection(502, "restate_error", f"Restate answered HTTP {response.status_code}")

    async def resolve_awakeable(self, awakeable_id: str, value_json: bytes) -> None:
        """`POST {ingress}/restate/awakeables/{id}/resolve` with the value as JSON."""
        await self._complete(awakeable_id, "resolve", value_json, "application/json")

    async def reject_awakeable(self, awakeable_id: str, reason: str) -> None:
        """`POST {ingress}/restate/awakeables/{id}/reject`; the text becomes the failure message
        (a `TerminalError` in the waiting handler)."""
        await self._complete(awakeable_id, "reject", reason.encode(), "text/plain; charset=utf-8")

    async def query(self, sql: str) -> list[dict[str, Any]]:
        """Rows of an admin-API SQL query (`POST {admin}/query`, JSON rows)."""
        body = json.dumps({"query": sql}).encode()
        response = await self._post(f"{self._admin}/query", body, "application/json", "query")
        if response.status_code != 200:
            log.warning(
                "SQL query: Restate answered HTTP %s: %s",
                response.status_code,
                response.text[:300],
            )
            raise Rejection(503, "restate_unavailable", "Restate's admin API refused the query")
        rows: list[dict[str, Any]] = response.json()["rows"]
        return rows

    async def ingress_healthy(self) -> bool:
        try:
            response = await self._http.get(f"{self._ingress}/restate/health")
        except httpx2.HTTPError:
            return False
        return response.status_code == 200
