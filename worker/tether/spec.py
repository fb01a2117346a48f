"""The `DurableAgent` spec: one pydantic model for the CRD, the worker and the CLI.

Field names are the manifest's camelCase; Python code reads them by their snake_case names.
Validation errors name the field and say how to fix it (`SpecError`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

API_VERSION = "tether.dev/v1alpha1"
KIND = "DurableAgent"
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
IMPORT_PATH = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
BUILTIN_TOOLS = ("read_file", "write_file", "append_file", "list_files")


class SpecError(ValueError):
    """A manifest that cannot be served, with one line per problem."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class SecretKeyRef(_Model):
    """A key of a Kubernetes Secret in the agent's namespace."""

    name: str = Field(min_length=1, description="Name of the Secret.")
    key: str = Field(min_length=1, description="Key within the Secret.")


class Pricing(_Model):
    """Model prices in USD per million tokens, for cost accounting and budgets."""

    input_per_m_tok: float = Field(ge=0, alias="inputPerMTok", description="Input tokens.")
    output_per_m_tok: float = Field(ge=0, alias="outputPerMTok", description="Output tokens.")
    cache_read_per_m_tok: float | None = Field(
        default=None, ge=0, alias="cacheReadPerMTok", description="Cache reads (default: input)."
    )
    cache_write_per_m_tok: float | None = Field(
        default=None, ge=0, alias="cacheWritePerMTok", description="Cache writes (default: input)."
    )


class ModelSpec(_Model):
    """Which model answers, and how to reach it."""

    provider: Literal["anthropic", "openai", "scripted"] = Field(
        description="anthropic, openai (any OpenAI-compatible server) or scripted."
    )
    name: str = Field(min_length=1, description="Model name, e.g. claude-sonnet-4-5.")
    base_url: str | None = Field(default=None, description="API base URL override.")
    max_tokens: int = Field(default=4096, gt=0, description="Output tokens per model call.")
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding the API key (Kubernetes)."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the API key (default: ANTHROPIC_API_KEY or "
        "OPENAI_API_KEY).",
    )
    pricing: Pricing | None = Field(default=None, description="Prices for cost accounting.")
    script: list[dict[str, Any]] | None = Field(
        default=None, description="Responses of the scripted provider, in order."
    )

    @model_validator(mode="after")
    def _script_only_when_scripted(self) -> ModelSpec:
        if self.provider == "scripted" and not self.script:
            raise ValueError("a scripted model needs `script`: a list of responses")
        return self


class ToolSpecEntry(_Model):
    """One tool: a built-in, or a Python function by import path."""

    name: str = Field(pattern=TOOL_NAME, description="Name the model calls the tool by.")
    builtin: Literal["read_file", "write_file", "append_file", "list_files"] | None = Field(
        default=None, description="A built-in tool."
    )
    python: str | None = Field(
        default=None,
        pattern=IMPORT_PATH,
        description="Import path of a ToolDef or @tool function: 'package.module:attribute'.",
    )
    description: str | None = Field(default=None, description="Override the description.")
    config: dict[str, Any] = Field(default_factory=dict, description="Built-in tool settings.")
    replay: Literal["safe", "unsafe"] | None = Field(
        default=None,
        description="safe: may run again after a crash; unsafe: reported as interrupted.",
    )
    require_approval: bool = Field(default=False, description="Park for a human's approval.")
    timeout: float | None = Field(default=None, gt=0, description="Seconds before the call fails.")

    @model_validator(mode="after")
    def _one_source(self) -> ToolSpecEntry:
        if (self.builtin is None) == (self.python is None):
            raise ValueError("set exactly one of `builtin` or `python`")
        return self


class Limits(_Model):
    """When a run stops on its own."""

    max_turns: int = Field(default=50, gt=0, description="Model calls per run.")
    max_cost_usd: float | None = Field(default=None, gt=0, description="Cost budget per run.")
    max_tokens: int | None = Field(default=None, gt=0, description="Token budget per run.")


class BehaviorSpec(_Model):
    """How the loop behaves."""

    cache: bool = Field(default=False, description="Place prompt-cache breakpoints.")
    compact_strategy: Literal["tail"] | None = Field(
        default=None, description="tail: drop the oldest turns to fit the context window."
    )
    max_concurrent_tools: int = Field(
        default=1, gt=0, description="Concurrency-safe tool calls run at once."
    )
    thinking_budget: int | None = Field(default=None, gt=0, description="Thinking tokens.")


class DurableAgentSpec(_Model):
    """The agent: model, prompt, tools and limits."""

    model: ModelSpec
    system: str | None = Field(default=None, description="System prompt.")
    tools: list[ToolSpecEntry] = Field(default_factory=list, description="Tools the agent has.")
    limits: Limits = Field(default_factory=Limits)
    behavior: BehaviorSpec = Field(default_factory=BehaviorSpec)

    @model_validator(mode="after")
    def _unique_tool_names(self) -> DurableAgentSpec:
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(duplicates)}")
        return self


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    namespace: str | None = None


class DurableAgent(BaseModel):
    """A `DurableAgent` manifest."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    api_version: Literal["tether.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["DurableAgent"]
    metadata: Metadata
    spec: DurableAgentSpec


def _location(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _explain(error: ValidationError) -> str:
    lines = []
    for problem in error.errors():
        loc = tuple(p for p in problem["loc"] if not re.fullmatch(r"function-after\[.*\]", str(p)))
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown field; check its spelling against the DurableAgent reference"
        lines.append(f"{_location(loc) or 'manifest'}: {message}")
    return "\n".join(lines)


def parse_agent(document: Any) -> DurableAgent:
    """Validate a manifest (already parsed from YAML or JSON)."""
    try:
        return DurableAgent.model_validate(document)
    except ValidationError as error:
        raise SpecError(_explain(error)) from None


def load_agent(path: str | Path) -> DurableAgent:
    """Read and validate a `DurableAgent` manifest file."""
    try:
        document = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise SpecError(f"{path}: cannot read the manifest: {error.strerror}") from None
    except yaml.YAMLError as error:
        raise SpecError(f"{path}: not valid YAML: {error}") from None
    try:
        return parse_agent(document)
    except SpecError as error:
        raise SpecError(f"{path}: invalid DurableAgent\n{error}") from None
