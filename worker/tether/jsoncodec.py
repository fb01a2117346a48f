"""JSON for journal entries and state values: compact UTF-8 bytes, fast (orjson).

Every step's result is encoded once and decoded on replay, on the hot path of every backend;
the standard library's encoder was a measurable share of a step's cost."""

from __future__ import annotations

from typing import Any

import orjson

_OPTIONS = orjson.OPT_NON_STR_KEYS  # like `json`: non-string keys become strings


def dumps(value: Any) -> bytes:
    # a function, not a partial: a partial with a keyword merges a dict on every call (slower)
    return orjson.dumps(value, option=_OPTIONS)


loads = orjson.loads
"""`orjson.loads` itself: no Python frame around it, on every replayed step."""
