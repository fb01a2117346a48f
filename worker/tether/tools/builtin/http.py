"""`http_request`: HTTP calls to an allow-list of hosts."""

from __future__ import annotations

import fnmatch
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import httpx2
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from ..base import ToolDef, ToolError
from ..decorator import tool


class HttpRequestConfig(BaseModel):
    """`config` of the http_request built-in."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    allow_hosts: list[str] = Field(min_length=1, description="Hosts it may call; `*.x.com` ok.")
    timeout_seconds: float = Field(default=30, gt=0)
    max_response_bytes: int = Field(default=64 * 1024, gt=0)


def host_allowed(url: str, patterns: list[str]) -> bool:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return parts.scheme in ("http", "https") and any(
        fnmatch.fnmatchcase(host, p.lower()) for p in patterns
    )


def http_request_tool(name: str, config: dict[str, Any]) -> ToolDef:
    settings = HttpRequestConfig.model_validate(config)

    @tool(name=name)
    async def http_request(
        url: Annotated[str, Field(description="Absolute http(s) URL.")],
        method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "GET",
        headers: dict[str, str] | None = None,
        body: str | None = None,
    ) -> str:
        """Make an HTTP request to an allowed host and return the status and body."""
        if not host_allowed(url, settings.allow_hosts):
            raise ToolError(
                f"{urlsplit(url).hostname or url!r} is not an allowed host "
                f"(allowed: {', '.join(settings.allow_hosts)})"
            )
        async with httpx2.AsyncClient(
            timeout=settings.timeout_seconds, follow_redirects=False
        ) as client:
            try:
                response = await client.request(method, url, headers=headers, content=body)
            except httpx2.HTTPError as error:
                raise ToolError(f"{method} {url} failed: {error}") from None
        content = response.content[: settings.max_response_bytes].decode(errors="replace")
        cut = len(response.content) - settings.max_response_bytes
        note = f"\n[... {cut} more bytes not shown ...]" if cut > 0 else ""
        return f"HTTP {response.status_code}\n{content}{note}"

    return http_request
