"""Tool input validation against the tool's JSON schema."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema
from jsonschema.protocols import Validator


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Validator:
    schema = json.loads(schema_json)
    return jsonschema.validators.validator_for(schema)(schema)


def validator_for(schema: dict[str, Any]) -> Validator:
    """A (cached) validator of `schema`."""
    return _validator(json.dumps(schema, sort_keys=True))


def validation_error(schema: dict[str, Any] | Validator, value: dict[str, Any]) -> str | None:
    """A one-line description of why `value` does not match `schema`, or None if it does."""
    validator = validator_for(schema) if isinstance(schema, dict) else schema
    if validator.is_valid(value):
        return None
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "input"
    return f"{where}: {error.message}"
