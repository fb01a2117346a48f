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


class InputValidator:
    """Checks a tool's input against its JSON schema. Built once per schema (`validator_for`);
    a call's check is then a dict walk for the usual tool schema (an object of simply typed
    properties), and jsonschema's only for the rest, or to word an error: its generic walk
    was the largest share of a tool call's overhead in the loop."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.jsonschema: Validator = jsonschema.validators.validator_for(schema)(schema)
        self._shortcut = _shortcut(schema)

    def surely_valid(self, value: Any) -> bool:
        """True only when `value` surely matches the schema (False: ask jsonschema)."""
        if self._shortcut is None or type(value) is not dict:
            return False
        required, types, closed = self._shortcut
        for key in required:
            if key not in value:
                return False
        for key, item in value.items():
            if key in types:
                allowed = types[key]
                if allowed is not None and type(item) not in allowed:
                    return False
            elif closed:
                return False
        return True

    def error(self, value: Any) -> str | None:
        """A one-line description of why `value` does not match, or None if it does."""
        if self.surely_valid(value) or self.jsonschema.is_valid(value):
            return None
        error = jsonschema.exceptions.best_match(self.jsonschema.iter_errors(value))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "input"
        return f"{where}: {error.message}"


_Shortcut = tuple[tuple[str, ...], dict[str, tuple[type, ...] | None], bool]
"""Required keys; each property's Python types that surely match it (None: any value, `()`:
none surely); whether other keys are refused."""


def _shortcut(schema: Any) -> _Shortcut | None:
    """What `surely_valid` checks, for an object of simply typed properties (else None)."""
    if type(schema) is not dict or not schema.keys() <= _OBJECT_KEYWORDS:
        return None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if (
        schema.get("type", "object") != "object"
        or type(properties) is not dict
        or type(required) is not list
        or not all(type(key) is str for key in required)
        or type(extra) is not bool
    ):
        return None
    types: dict[str, tuple[type, ...] | None] = {}
    for key, sub in properties.items():
        if type(sub) is not dict or not sub.keys() <= _PROPERTY_KEYWORDS:
            types[key] = ()  # keywords the walk does not check
        elif "type" not in sub:
            types[key] = None
        else:
            kind = sub["type"]
            types[key] = _EXACT_TYPES.get(kind, ()) if type(kind) is str else ()
    return tuple(required), types, not extra


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> InputValidator:
    return InputValidator(json.loads(schema_json))


def validator_for(schema: dict[str, Any]) -> InputValidator:
    """A (cached) validator of `schema`."""
    return _validator(json.dumps(schema, sort_keys=True))


def validation_error(schema: dict[str, Any], value: dict[str, Any]) -> str | None:
    """A one-line description of why `value` does not match `schema`, or None if it does."""
    return validator_for(schema).error(value)
