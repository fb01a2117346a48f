"""What the spec and the agent agree on about a structured output: the name of the tool that
gives it and what its schema must be. Kept below both, as the operator reads specs and never
imports the agent."""

from __future__ import annotations

from typing import Any

OUTPUT_TOOL = "final_answer"


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` is not a JSON Schema (None: it is one)."""
    import jsonschema  # on first use: most agents have no output, and the CLI starts faster

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as error:
        return str(error.message)
    return None
