"""JSON for journal entries and state values: compact UTF-8 bytes, fast (orjson).

Every step's result is encoded once and decoded on replay, on the hot path of every backend;
the standard library's encoder was a measurable share of a step's cost."""

from __future__ import annotations

from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS  # like `json`: non-string keys become strings


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=_OPTIONS)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)
