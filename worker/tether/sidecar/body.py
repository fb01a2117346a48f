"""Reading a webhook body safely: JSON content type only, and never more than the size limit,
whether or not the client declared its length truthfully."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from .rejection import Rejection


def require_json_content_type(request: Request) -> None:
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise Rejection(415, "unsupported_media_type", "the body must be application/json")


def _too_large(limit: int) -> Rejection:
    return Rejection(413, "too_large", f"the body is larger than {limit} bytes")


async def read_limited_body(request: Request, limit: int) -> bytes:
    """The raw body; 413 as soon as the declared or the actual length passes `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isascii() or not declared.isdigit():
            raise Rejection(400, "bad_body", "malformed Content-Length")
        if int(declared) > limit:
            raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(body: bytes) -> Any:
    """The body as strict JSON (no NaN or Infinity), or a 400 `Rejection`."""
    try:
        return json.loads(body, parse_constant=_no_constants)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Rejection(400, "bad_body", "the body is not valid JSON") from None
