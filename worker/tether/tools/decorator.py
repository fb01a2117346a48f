"""`@tool`: a ToolDef from a typed async function, its JSON schema built by pydantic."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, get_args, get_type_hints, overload

import pydantic

from .base import ReplayPolicy, ToolContext, ToolDef, ToolOutput, ToolSpec

ToolFunction = Callable[..., Awaitable[ToolOutput]]


def _description(fn: ToolFunction, given: str | None) -> str:
    if given:
        return given
    doc = inspect.getdoc(fn)
    if not doc:
        raise TypeError(f"tool {fn.__name__!r} needs a description or a docstring")
    return doc


def _is_context(hint: Any) -> bool:
    """`ToolContext`, or an optional `ToolContext`."""
    return hint is ToolContext or ToolContext in get_args(hint)


def build_tool(
    fn: ToolFunction,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: ReplayPolicy = "unsafe",
    concurrency_safe: bool = False,
) -> ToolDef:
    """Build a ToolDef from `fn`; see `tool`."""
    if not inspect.iscoroutinefunction(fn):
        raise TypeError(f"tool {fn.__name__!r} must be an async function")
    hints = get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        hint = hints.get(param.name, Any)
        if _is_context(hint):
            context_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__!r}: *args and **kwargs have no schema")
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, default)
    model = pydantic.create_model(f"{fn.__name__}_input", **fields)
    schema = model.model_json_schema()
    schema.pop("title", None)

    async def execute(input: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        # iter(): dict() of a model first asks it for `keys`, a slow miss in pydantic's __getattr__
        arguments = dict(iter(model.model_validate(input)))
        if context_param:
            arguments[context_param] = ctx
        return await fn(**arguments)

    return ToolDef(
        spec=ToolSpec(
            name=name or fn.__name__, description=_description(fn, description), input_schema=schema
        ),
        execute=execute,
        is_concurrency_safe=concurrency_safe,
        replay=replay,
        uses_context=context_param is not None,
    )


@overload
def tool(fn: ToolFunction, /) -> ToolDef: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    replay: ReplayPolicy = "unsafe",
    concurrency_safe: bool = False,
) -> Callable[[ToolFunction], ToolDef]: ...


def tool(
    fn: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    replay: ReplayPolicy = "unsafe",
    concurrency_safe: bool = False,
) -> ToolDef | Callable[[ToolFunction], ToolDef]:
    """Turn a typed async function into a tool.

    The input schema comes from the parameters' type hints (pydantic types, defaults and
    `Annotated[..., Field(description=...)]` included); the description from `description` or
    the docstring. A parameter annotated `ToolContext` receives the call's context.

        @tool(replay="safe", concurrency_safe=True)
        async def weather(city: str) -> str:
            "The current weather in a city."
    """

    def wrap(f: ToolFunction) -> ToolDef:
        return build_tool(
            f, name=name, description=description, replay=replay, concurrency_safe=concurrency_safe
        )

    return wrap(fn) if fn is not None else wrap
