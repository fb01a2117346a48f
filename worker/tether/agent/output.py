"""Structured output: a run that ends with a JSON value of a given schema, not only text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..output_schema import OUTPUT_TOOL, schema_problem
from ..tools.base import ToolDef, ToolSpec

WRAPPED = "value"
"""The one property of the tool's input that holds an output whose schema is not an object's
(tool inputs are objects for every provider)."""


async def _accept(arguments: dict[str, Any], _: Any) -> str:
    return "Final answer accepted."


@dataclass(frozen=True)
class Output:
    """The final answer a run must give: a JSON value that matches `schema`, given as the input
    of the tool `name` (a tool call is how every provider takes a value of a schema). The run
    ends once a call of it is accepted (the turn's other calls run first, as the model asked
    for them together); its value is `AgentStats.output`, and `AgentStats.text` its JSON. A
    model that answers in text only, or whose value does not match, is told so and tries
    again, `retries` times in a run; then the run ends with status `error`. Every decision is
    a function of the journaled answers, so a replay ends the same way."""

    schema: dict[str, Any]
    description: str = "Give your final answer. The run ends when this call is accepted."
    name: str = OUTPUT_TOOL
    retries: int = 2
    tool: ToolDef = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must not be negative, not {self.retries}")
        problem = schema_problem(self.schema)
        if problem is not None:
            raise ConfigError(f"the output schema is not a JSON Schema: {problem}")
        wrapped = {
            "type": "object",
            "properties": {WRAPPED: self.schema},
            "required": [WRAPPED],
            "additionalProperties": False,
        }
        spec = ToolSpec(self.name, self.description, self.schema if self._is_object else wrapped)
        tool = ToolDef(spec, _accept, is_concurrency_safe=True, replay="safe", uses_context=False)
        object.__setattr__(self, "tool", tool)

    @classmethod
    def of(cls, model: Any, **options: Any) -> Output:
        """The output of a pydantic model class (its JSON schema); `model.model_validate(
        stats.output)` reads the value back."""
        return cls(model.model_json_schema(), **options)

    @property
    def _is_object(self) -> bool:
        return self.schema.get("type") == "object"

    def value(self, arguments: dict[str, Any]) -> Any:
        """The output in an accepted call's input."""
        return arguments if self._is_object else arguments[WRAPPED]

    @property
    def reminder(self) -> str:
        """What a model that answered in text only is told."""
        return (
            f"Give your final answer by calling the `{self.name}` tool: an answer in text "
            "does not end the run."
        )
