"""Reading a webhook body safely from the ASGI `receive` channel: JSON content type only, and
never more than the size limit, whether or not the client declared its length truthfully."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from starlette.types import Receive

from .auth import authenticate_request
from .rejection import Rejection


def require_json_content_type(headers: Mapping[str, str]) -> None:
    media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise Rejection(415, "unsupported_media_type", "the body must be application/json")


def _too_large(limit: int) -> Rejection:
    return Rejection(413, "too_large", f"the body is larger than {limit} bytes")


async def read_limited_body(receive: Receive, headers: Mapping[str, str], limit: int) -> bytes:
    """The raw body; 413 as soon as the declared or the actual length passes `limit`."""
    declared = headers.get("content-length")
    if declared is not None:
        if not declared.isascii() or not declared.isdigit():
            raise Rejection(400, "bad_body", "malformed Content-Length")
        if len(declared) > 18 or int(declared) > limit:  # no int() of 4,300 digits
            raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Rejection(400, "bad_body", "the client went away before the body was read")
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def read_signed_json(
    receive: Receive,
    headers: Mapping[str, str],
    path: str,
    secrets: Sequence[bytes],
    limit: int,
    idempotency_key: str | None = None,
) -> tuple[bytes, Any, str, int]:
    """A signed JSON request's raw body, its value, and its signature and timestamp: content
    type, size limit, signature (over the raw body, and `idempotency_key` if given), then JSON,
    in that order."""
    require_json_content_type(headers)
    body = await read_limited_body(receive, headers, limit)
    signature, timestamp = authenticate_request(secrets, body, headers, path, idempotency_key)
    return body, parse_json(body), signature, timestamp


def parse_json(body: bytes) -> Any:
    """The body as strict JSON (no NaN or Infinity, valid UTF-8), or a 400 `Rejection`."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise Rejection(400, "bad_body", "the body is not valid JSON") from None
