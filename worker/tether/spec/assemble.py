"""Turn a `DurableAgentSpec` into the parts of an agent: provider, tools, behavior."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml

from ..agent.behavior import Behavior
from ..agent.output import Output
from ..agent.spawn import Subagent
from ..budget import Limits
from ..providers.base import Fallback, Pricing, Provider
from ..providers.cooldown import Cooldown
from ..providers.limit import Limited
from ..providers.pace import LocalPacer, Pacer
from ..providers.scripted import scripted
from ..providers.spend import LocalSpendGate, SpendGate
from ..rate import Pace, Rate
from ..spend_caps import SpendCap
from ..tools.base import ToolContext, ToolDef, ToolError, ToolOutput, ToolSpec
from ..tools.builtin import BUILTINS, Workspace
from ..tools.decorator import build_tool
from ..tools.human import Wait, approval_gate, ask_human_tool
from ..tools.toolset import Toolset
from . import (
    DurableAgentSpec,
    McpEnvVar,
    McpHeader,
    ModelChoice,
    ModelCooldown,
    OutputSpec,
    RateLimit,
    SpecError,
    ToolSpecEntry,
    parse_duration,
)
from .stopping import MCP_TIMEOUT

if TYPE_CHECKING:
    from ..tools.mcp import CallObserver


def behavior_from_spec(spec: DurableAgentSpec) -> Behavior:
    return Behavior(
        max_turns=spec.limits.max_turns,
        max_tokens=spec.limits.max_tokens,
        max_cost_usd=spec.limits.max_cost_usd,
        on_budget_exhausted=spec.limits.on_exhausted or "stop",
        cache=spec.behavior.cache,
        compact_strategy=spec.behavior.compact_strategy,
        max_concurrent_tools=spec.behavior.max_concurrent_tools,
        thinking_budget=spec.behavior.thinking_budget,
        max_output_tokens=spec.model.max_tokens,
    )


def _pricing(model: ModelChoice) -> Pricing | None:
    p = model.pricing
    if p is None:
        return None
    return Pricing(
        input_per_mtok=p.input_per_m_tok,
        output_per_mtok=p.output_per_m_tok,
        cache_read_per_mtok=p.cache_read_per_m_tok,
        cache_write_per_mtok=p.cache_write_per_m_tok,
    )


PacerOf = Callable[[ModelChoice, Pace], Pacer]
"""Where the calls of a model with a `rateLimit` take their slots: this process
(`local_pacer`), or every worker of the agent (the worker's, through Restate)."""


def local_pacer(_: ModelChoice, pace: Pace) -> Pacer:
    return LocalPacer(pace)


def pace_of(limit: RateLimit) -> Pace:
    requests, tokens = limit.requests_per_minute, limit.input_tokens_per_minute
    return Pace(
        requests=None if requests is None else Rate(requests, limit.burst),
        input_tokens=None if tokens is None else Rate(tokens),
    )


def spend_caps_of(spec: DurableAgentSpec) -> list[SpendCap]:
    """The spec's caps on what its runs spend together (`limits.spendCaps`), a model's named
    by its `provider/name`."""
    return [
        SpendCap(
            cap.per,
            Limits(cap.max_cost_usd, cap.max_tokens),
            cap.on_reached or "stop",
            None if cap.model is None else spec.model.label_of(cap.model),
            cap.time_zone,
        )
        for cap in spec.limits.spend_caps or []
    ]


def local_spend_gate(spec: DurableAgentSpec) -> SpendGate | None:
    """The spec's spend caps kept by this process alone (None: it has none)."""
    caps = spend_caps_of(spec)
    return LocalSpendGate(caps) if caps else None


def provider_from_spec(
    spec: DurableAgentSpec,
    api_key: str,
    pacer_of: PacerOf = local_pacer,
    spend: SpendGate | None = None,
) -> Provider:
    """The spec's provider with `api_key` (anthropic or openai)."""
    return provider_of(spec.model, api_key, pacer_of, spend)


def provider_of(
    model: ModelChoice,
    api_key: str,
    pacer_of: PacerOf = local_pacer,
    spend: SpendGate | None = None,
) -> Provider:
    """The provider of `model` with `api_key`, behind its cap on calls in flight, its pace and
    the agent's spend caps (`spend`, shared by all the agent's models)."""
    made = _made(model, api_key)
    cap, limit = model.max_concurrent_calls, model.rate_limit
    if cap is None and limit is None and spend is None:
        return made
    pacer = None if limit is None else pacer_of(model, pace_of(limit))
    return Limited(made, cap, pacer=pacer, spend=spend)


def _made(model: ModelChoice, api_key: str) -> Provider:
    if model.provider == "scripted":
        assert model.script is not None
        return scripted(
            model.script,
            model=model.name,
            pricing=_pricing(model),
            context_window=model.context_window,
        )
    from .. import providers  # the SDK-backed ones import their SDK on first use

    make = providers.anthropic if model.provider == "anthropic" else providers.openai
    timeout = {"timeout": parse_duration(model.timeout)} if model.timeout else {}
    return make(
        model.name,
        api_key=api_key,
        base_url=model.base_url,
        pricing=_pricing(model),
        context_window=model.context_window,
        **timeout,
    )


def fallbacks_from_spec(
    spec: DurableAgentSpec,
    env: dict[str, str],
    pacer_of: PacerOf = local_pacer,
    spend: SpendGate | None = None,
) -> list[Fallback]:
    """The spec's fallback models, each with its key from `env` and its own output tokens; a
    clear error for a key that is not set."""
    return [
        Fallback(
            provider_of(model, _require_key(model, env, where), pacer_of, spend), model.max_tokens
        )
        for where, model in spec.model.choices()[1:]
    ]


def cooldown_from_spec(spec: DurableAgentSpec) -> Cooldown | None:
    """The cooldown of the spec's models (the default one for fallbacks; none without)."""
    if not spec.model.fallbacks:
        return None
    chosen = spec.model.cooldown or ModelCooldown()
    return Cooldown(chosen.failures, parse_duration(chosen.duration))


def output_from_spec(spec: DurableAgentSpec) -> Output | None:
    """The value the spec's runs end with (none: text)."""
    return _output(spec.output)


def _output(chosen: OutputSpec | None) -> Output | None:
    return None if chosen is None else Output(chosen.json_schema, retries=chosen.retries)


def subagents_from_spec(
    spec: DurableAgentSpec, provider: Provider, fallbacks: Sequence[Fallback]
) -> list[Subagent]:
    """The spec's named sub-agents on its models as built (`provider`, `fallbacks`). One that
    names a model asks it first, then the others in their order, each with its maxTokens;
    models other than the spec's (`tether run` without the spec's key) are kept as they are."""
    if spec.subagents is None:
        return []
    models = [Fallback(provider, spec.model.max_tokens), *fallbacks]
    made = []
    for entry in spec.subagents.agents:
        behavior: dict[str, Any] = {} if entry.max_turns is None else {"max_turns": entry.max_turns}
        first = None if entry.model is None else spec.model.index_of(entry.model)
        chain: list[Fallback] = []
        if first and len(models) == len(spec.model.choices()):
            chain = [models[first], *models[:first], *models[first + 1 :]]
            behavior["max_output_tokens"] = chain[0].max_output_tokens
        made.append(
            Subagent(
                entry.name,
                entry.description,
                system=entry.system,
                tools=None if entry.tools is None else tuple(entry.tools),
                provider=chain[0].provider if chain else None,
                fallbacks=tuple(chain[1:]),
                output=_output(entry.output),
                behavior=behavior or None,
            )
        )
    return made


def api_key_for(spec: DurableAgentSpec, env: dict[str, str]) -> str | None:
    variable = spec.model.key_variable
    return env.get(variable) or None if variable else None


def require_api_key(spec: DurableAgentSpec, env: dict[str, str]) -> str:
    """The model's API key from `env` ("" for the scripted model); a clear error without it."""
    return _require_key(spec.model, env, "spec.model")


def _require_key(model: ModelChoice, env: dict[str, str], where: str) -> str:
    variable = model.key_variable
    if variable is None:
        return ""
    if not env.get(variable):
        whose = "the model's" if where == "spec.model" else f"{where}'s ({model.label})"
        raise SpecError(f"{variable} is not set: the worker needs {whose} API key")
    return env[variable]


def load_script(path: str | Path) -> tuple[list[dict[str, Any]], float]:
    """A scripted model file: `responses` (a list) and an optional per-call `delay` (seconds)."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SpecError(f"{path}: cannot read the script: {error}") from None
    responses = document.get("responses") if isinstance(document, dict) else None
    if not isinstance(responses, list) or not responses:
        raise SpecError(f"{path}: a script needs `responses`, a non-empty list")
    return responses, float(document.get("delay", 0))


def _import_tool(entry: ToolSpecEntry) -> ToolDef:
    assert entry.python is not None
    module_name, _, attribute = entry.python.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise SpecError(
            f"tools[{entry.name}].python: cannot import {entry.python!r} ({error}); install the "
            "package in the worker image or fix the path"
        ) from None
    if isinstance(target, ToolDef):
        return target
    if callable(target):
        return build_tool(target)
    raise SpecError(f"tools[{entry.name}].python: {entry.python!r} is not a tool or a function")


def with_timeout(tool: ToolDef, seconds: float) -> ToolDef:
    """`tool`, failing with a tool error when its body runs longer than `seconds`."""
    inner = tool.execute

    async def execute(arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        try:
            return await asyncio.wait_for(inner(arguments, ctx), seconds)
        except TimeoutError:
            raise ToolError(f"timed out after {seconds:g} s") from None

    return dataclasses.replace(tool, execute=execute)


SPAWN_TOOL = "spawn"
"""The name of the sub-agent tool that `spec.subagents` adds."""


def check_subagents(spec: DurableAgentSpec) -> None:
    """With sub-agents, the name `spawn` belongs to the sub-agent tool."""
    if spec.subagents is None:
        return
    for index, entry in enumerate(spec.tools):
        if entry.name == SPAWN_TOOL:
            raise SpecError(
                f"spec.tools[{index}].name: {SPAWN_TOOL!r} is the sub-agent tool of "
                "`spec.subagents`; rename this tool"
            )


ParkingTool = Callable[[ToolSpecEntry, ToolDef | None], ToolDef]
"""Builds the tool for an entry that waits for a person: `ask_human` (no inner tool) or an
approval gate around the inner tool."""


def parking_with(wait: Wait, on_timeout: Literal["deny", "approve"]) -> ParkingTool:
    """The `ParkingTool` of a runtime that waits for people through `wait`."""

    def parking(entry: ToolSpecEntry, inner: ToolDef | None) -> ToolDef:
        if inner is None:
            return ask_human_tool(entry.name, wait)
        return approval_gate(inner, wait, on_timeout)

    return parking


def _waits_for_people(entry: ToolSpecEntry) -> bool:
    overrides = entry.mcp.tools.values() if entry.mcp else ()
    return (
        entry.require_approval
        or entry.builtin == "ask_human"
        or any(o.require_approval for o in overrides)
    )


class SpecTools:
    """A spec's tools for many runs. A tool is built once, here: a built-in's input model and
    schema cost ~0.5 ms to make, about what a turn costs the worker. Each run gets them
    from `for_run`, with what is its own: the entries that wait for a person, built by its
    `parking` (`tether worker`: Restate awakeables; `tether run`: the embedded answers), and a
    toolset per `mcp` entry (its connection). Built-in file tools are confined to `workspace`;
    an `mcp` entry's header credentials are read from `env`, and `observe` is told of its
    calls. `wrap` is given each tool as built (an MCP server's as listed), before an approval
    gate (`tether crashtest` counts their bodies so)."""

    def __init__(
        self,
        spec: DurableAgentSpec,
        workspace: str | Path,
        *,
        env: Mapping[str, str] | None = None,
        observe: CallObserver | None = None,
        wrap: Callable[[ToolDef], ToolDef] | None = None,
    ) -> None:
        self._env = env or {}
        self._observe = observe
        self._wrap = wrap
        root = Workspace(workspace)
        self._workspace = str(root.root)
        self._entries: list[tuple[ToolSpecEntry, ToolDef | None]] = []
        for entry in spec.tools:
            built = None if entry.builtin == "ask_human" or entry.mcp else _built(entry, root)
            self._entries.append((entry, wrap(built) if wrap and built else built))

    def for_run(self, parking: ParkingTool | None = None) -> list[ToolDef | Toolset]:
        tools: list[ToolDef | Toolset] = []
        for entry, built in self._entries:
            if _waits_for_people(entry) and parking is None:
                raise SpecError(
                    f"tools[{entry.name}]: approvals and ask_human wait for a person; build the "
                    "tools with a `parking` function for the runtime"
                )
            if entry.mcp is not None:
                tools.append(
                    mcp_toolset(
                        entry, self._env, parking, self._observe, self._workspace, self._wrap
                    )
                )
            elif built is None or entry.require_approval:  # `ask_human`, or an approval gate
                assert parking is not None
                tools.append(parking(entry, built))
            else:
                tools.append(built)
        return tools


def _built(entry: ToolSpecEntry, root: Workspace) -> ToolDef:
    """The tool of a built-in or `python` entry, with the entry's name, description, replay
    policy and timeout."""
    if entry.builtin is not None:
        try:
            tool = BUILTINS[entry.builtin](entry.name, entry.config, root)
        except ValueError as error:  # pydantic's ValidationError included
            raise SpecError(f"tools[{entry.name}].config: {error}") from None
    else:
        tool = _import_tool(entry)
    spec_ = ToolSpec(
        name=entry.name,
        description=entry.description or tool.spec.description,
        input_schema=tool.spec.input_schema,
    )
    changes: dict[str, Any] = {"spec": spec_}
    if entry.replay is not None:
        changes["replay"] = entry.replay
    tool = dataclasses.replace(tool, **changes)
    if entry.timeout:
        tool = with_timeout(tool, parse_duration(entry.timeout))
    return tool


def tools_from_spec(
    spec: DurableAgentSpec,
    workspace: str | Path,
    parking: ParkingTool | None = None,
    *,
    env: Mapping[str, str] | None = None,
    observe: CallObserver | None = None,
    wrap: Callable[[ToolDef], ToolDef] | None = None,
) -> list[ToolDef | Toolset]:
    """The spec's tools for one run (see `SpecTools`)."""
    return SpecTools(spec, workspace, env=env, observe=observe, wrap=wrap).for_run(parking)


def mcp_toolset(
    entry: ToolSpecEntry,
    env: Mapping[str, str],
    parking: ParkingTool | None,
    observe: CallObserver | None,
    workspace: str,
    wrap: Callable[[ToolDef], ToolDef] | None = None,
) -> Toolset:
    """The toolset of an `mcp` entry, its headers' and variables' credentials read from `env`;
    a stdio server confined to `workspace` and its own paths unless its `sandbox` is off."""
    from ..tools.mcp import MCPServer, MCPToolset, ToolOverride

    mcp = entry.mcp
    assert mcp is not None

    def credential(field: str, item: McpHeader | McpEnvVar) -> str:
        variable = item.variable(entry.name)
        value = env.get(variable, "")
        if not value:
            raise SpecError(
                f"{variable} is not set: tools[{entry.name}].mcp.{field} {item.name!r} takes "
                "its value from it (on Kubernetes the operator maps it in from its secretRef)"
            )
        return value

    headers = {
        h.name: h.value if h.value is not None else credential("headers", h) for h in mcp.headers
    }
    server_env = {v.name: credential("env", v) if v.from_worker else v.value or "" for v in mcp.env}
    server = MCPServer(
        name=entry.name,
        url=mcp.url,
        transport=mcp.transport,
        command=tuple(mcp.command or ()),
        env=server_env,
        headers=headers,
        include=tuple(mcp.include),
        exclude=tuple(mcp.exclude),
        prefix=mcp.prefix,
        timeout=parse_duration(entry.timeout) if entry.timeout else MCP_TIMEOUT,
        replay=entry.replay,
        require_approval=entry.require_approval,
        tools={
            name: ToolOverride(o.replay, o.require_approval, o.description)
            for name, o in mcp.tools.items()
        },
        sandbox=mcp.sandbox if mcp.command and mcp.sandbox.enabled else None,
        workspace=workspace,
    )

    def approval(tool: ToolDef) -> ToolDef:
        assert parking is not None
        return parking(entry, tool)

    return MCPToolset(server, approval=approval if parking else None, observe=observe, wrap=wrap)
