"""Tool input validation against the tool's JSON schema."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.protocols import Validator

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated"})
_OBJECT_KEYWORDS = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}
_PROPERTY_KEYWORDS = _ANNOTATIONS | {"type"}
_EXACT_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "array": (list,),
    "object": (dict,),
}
"""Python types that surely have each JSON type (a subset: `1.0` is an integer too)."""


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Validator:
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


def validator_for(schema: dict[str, Any]) -> Validator:
    """A (cached) validator of `schema`."""
    return _validator(json.dumps(schema, sort_keys=True))


def _surely_valid(schema: Any, value: Any) -> bool:
    """A shortcut for the usual tool schema, an object of simply typed properties: True only
    when `value` surely matches it. False leaves the answer to jsonschema, which also words the
    error; its generic walk was the largest share of a tool call's overhead in the loop."""
    if type(value) is not dict or type(schema) is not dict or not schema.keys() <= _OBJECT_KEYWORDS:
        return False
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if (
        schema.get("type", "object") != "object"
        or type(properties) is not dict
        or type(required) is not list
        or not (extra is True or (extra is False and value.keys() <= properties.keys()))
    ):
        return False
    for key in required:
        if type(key) is not str or key not in value:
            return False
    for key, item in value.items():
        sub = properties.get(key, {})
        if type(sub) is not dict or not sub.keys() <= _PROPERTY_KEYWORDS:
            return False
        kind = sub.get("type")
        if kind is not None and (
            type(kind) is not str or type(item) not in _EXACT_TYPES.get(kind, ())
        ):
            return False
    return True


def validation_error(schema: dict[str, Any] | Validator, value: dict[str, Any]) -> str | None:
    """A one-line description of why `value` does not match `schema`, or None if it does."""
    validator = validator_for(schema) if isinstance(schema, dict) else schema
    if _surely_valid(validator.schema, value) or validator.is_valid(value):
        return None
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "input"
    return f"{where}: {error.message}"
