"""The `DurableAgent` spec: one pydantic model for the CRD, the worker and the CLI.

Field names are the manifest's camelCase; Python code reads them by their snake_case names.
Validation errors name the field and say how to fix it (`SpecError`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, Self

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from ..cron import EXPRESSION_HELP, cron_problem
from ..errors import ConfigError
from ..output_schema import OUTPUT_TOOL, schema_problem
from ..periods import PERIODS, ZONE_PATTERN, Per, zone_problem
from ..sandbox.config import SandboxConfig
from ..secret_env import NOTIFY_URL_ENV, SLACK_SIGNING_SECRET_ENV, WORKER_SECRET_ENV

API_VERSION = "tether.dev/v1alpha1"
DURATION = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration such as `90s`, `5m` or `1h30m`."""
    if not re.fullmatch(DURATION, text):
        raise ValueError(f"{text!r} is not a duration like 30s, 5m or 1h30m")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(text))


Duration = Annotated[
    str, Field(pattern=DURATION, description="A duration such as 30s, 5m or 1h30m.")
]


def _longer_than_zero(value: str) -> str:
    if parse_duration(value) <= 0:
        raise ValueError("must be longer than zero")
    return value


PositiveDuration = Annotated[Duration, AfterValidator(_longer_than_zero)]
KIND = "DurableAgent"
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
IMPORT_PATH = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
BuiltinTool = Literal[
    "read_file", "write_file", "append_file", "list_files", "http_request", "shell", "ask_human"
]


class SpecError(ConfigError):
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


ScriptResponses = list[dict[str, Any]]
ScriptSpec = ScriptResponses | dict[str, ScriptResponses]
"""A scripted model's responses: one list, or lists keyed by the conversation's first user
message (exact text; `*` for any other conversation), so a parent and its sub-agents (whose
first message is their task) can follow different scripts."""
SCRIPT_FORMS = (
    "a list of responses, or a mapping from a prompt (the conversation's first user message; "
    '"*" for any other) to a list of responses, or that mapping as a list of '
    "{prompt, responses} entries"
)
ENTRY_KEYS = {"prompt", "responses"}
SCRIPT_LIST_SCHEMA: dict[str, Any] = {
    "anyOf": [
        {"type": "array", "items": {"type": "object", "additionalProperties": True}},
        {"type": "null"},
    ]
}
"""The published schema (and so the CRD's) keeps the list forms: a structural schema cannot say
"a list or a map" (and CEL rules cannot see a field of no type). In a DurableAgent the keyed form
is a list of {prompt, responses} entries; the mapping is for `tether run`, `tether dev` and the
worker's spec file."""


def _check_responses(responses: list[Any], where: str) -> None:
    for index, response in enumerate(responses):
        if not isinstance(response, dict):
            raise ValueError(
                f"response {index + 1}{where} must be a mapping with `text`, `tool_calls` or "
                f"`usage`, not {type(response).__name__}"
            )


DEFAULT_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}
"""Where the worker reads a model's API key when its `apiKeyEnv` is unset."""


class RateLimit(_Model):
    """The pace of a model's calls, across all the agent's workers (`tether.rate.Pace`)."""

    requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Calls a minute, as the provider counts them for a key.",
    )
    burst: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Calls that may go at once after a quiet while (unset: requestsPerMinute, "
        "as a provider's own token bucket lets them).",
    )
    input_tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000_000,
        description="Input tokens a minute, a minute's worth at once: each call counts its "
        "request's, estimated at 4 characters a token before it is sent (cached ones too).",
    )

    @model_validator(mode="after")
    def _a_rate(self) -> RateLimit:
        if self.requests_per_minute is None and self.input_tokens_per_minute is None:
            raise ValueError("give requestsPerMinute, inputTokensPerMinute or both")
        if self.burst is not None and self.requests_per_minute is None:
            raise ValueError("burst is of requestsPerMinute: give it too")
        return self


class ModelChoice(_Model):
    """A model, and how to reach it."""

    provider: Literal["anthropic", "openai", "scripted"] = Field(
        description="anthropic, openai (any OpenAI-compatible server) or scripted."
    )
    name: str = Field(min_length=1, description="Model name, e.g. claude-sonnet-4-5.")
    base_url: str | None = Field(default=None, description="API base URL override.")
    max_tokens: int = Field(default=4096, gt=0, description="Output tokens per model call.")
    context_window: int | None = Field(
        default=None,
        gt=0,
        description="The model's context window in tokens, which tail compaction "
        "(behavior.compactStrategy) fits each request into (default: 200000; 128000 for openai).",
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret holding the API key (Kubernetes)."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Environment variable holding the API key (default: ANTHROPIC_API_KEY or "
        "OPENAI_API_KEY).",
    )
    pricing: Pricing | None = Field(default=None, description="Prices for cost accounting.")
    script: Annotated[ScriptSpec | None, WithJsonSchema(SCRIPT_LIST_SCHEMA)] = Field(
        default=None,
        description="Responses of the scripted provider, in order; or, to follow the "
        'conversation\'s first user message, {prompt, responses} entries (prompt "*": any '
        "other).",
    )
    timeout: PositiveDuration | None = Field(
        default=None,
        description="How long a call waits for the model (to connect, then for each part of "
        "its streamed answer) before it fails and goes to the next of model.fallbacks "
        "(default: 10m).",
    )
    max_concurrent_calls: int | None = Field(
        default=None,
        ge=1,
        le=10_000,
        description="Calls of this model in flight at once in one worker process; its runs' "
        "other calls wait their turn (unset: no cap). The cap of the agent is this times its "
        "workers.",
    )

    rate_limit: RateLimit | None = Field(
        default=None,
        description="Its calls paced to a rate across all the agent's workers and versions: a "
        "call that would go past it waits for its slot, inside its model step (unset: no pace).",
    )

    @field_validator("script", mode="before")
    @classmethod
    def _script_shape(cls, value: Any) -> Any:
        if (
            isinstance(value, list)
            and value
            and all(isinstance(item, dict) and set(item) == ENTRY_KEYS for item in value)
        ):
            keyed = {item["prompt"]: item["responses"] for item in value}
            if len(keyed) < len(value):
                raise ValueError("a prompt has two entries: give each prompt one")
            value = keyed
        if value is None or isinstance(value, list):
            _check_responses(value or [], "")
        elif isinstance(value, dict):
            if not value:
                raise ValueError(f"must not be empty: give {SCRIPT_FORMS}")
            for key, responses in value.items():
                if not isinstance(key, str):
                    raise ValueError(f"the prompt {key!r} must be a string; quote it")
                if not isinstance(responses, list) or not responses:
                    raise ValueError(
                        f"the script for prompt {key!r} must be a non-empty list of responses"
                    )
                _check_responses(responses, f" for prompt {key!r}")
        else:
            raise ValueError(f"must be {SCRIPT_FORMS}, not {type(value).__name__}")
        return value

    @model_validator(mode="after")
    def _script_only_when_scripted(self) -> ModelChoice:
        if self.provider == "scripted" and not self.script:
            raise ValueError(f"a scripted model needs `script`: {SCRIPT_FORMS}")
        return self

    @property
    def key_variable(self) -> str | None:
        """The variable the worker reads this model's API key from (none: the scripted one)."""
        if self.provider == "scripted":
            return None
        return self.api_key_env or DEFAULT_KEY_ENV[self.provider]

    @property
    def label(self) -> str:
        return f"{self.provider}/{self.name}"

    def is_named(self, name: str) -> bool:
        """Whether `name` names this model: its name, or its `provider/name`."""
        return name in (self.name, self.label)


MAX_FALLBACKS = 4


class ModelCooldown(_Model):
    """How long a model that keeps failing is skipped (`tether.providers.Cooldown`)."""

    failures: int = Field(
        default=3,
        ge=1,
        le=100,
        description="Failed calls in a row (a rate limit, an overload, a 5xx, a timeout) after "
        "which a model is skipped.",
    )
    duration: Duration = Field(
        default="30s",
        description="How long it is skipped before one call tries it again (0s: never skipped).",
    )


class ModelSpec(ModelChoice):
    """Which model answers, how to reach it, and the models that answer when it fails."""

    fallbacks: list[ModelChoice] | None = Field(
        default=None,
        max_length=MAX_FALLBACKS,
        description="Models that answer, in order, when the one before fails (an outage, a "
        "rate limit, a refused request): a failed call goes on to the next one at once, and "
        "when the last fails too, a retryable failure backs off and starts again from the "
        "first. Each has its own key, prices, context window and maxTokens.",
    )
    cooldown: ModelCooldown | None = Field(
        default=None,
        description="A model other than the last that keeps failing is skipped for a while, "
        "each worker learning on its own (default: after 3 failures in a row, for 30s).",
    )

    def choices(self) -> list[tuple[str, ModelChoice]]:
        """This model and its fallbacks, in order, each with its field's path."""
        fallbacks = enumerate(self.fallbacks or [])
        return [("spec.model", self), *((f"spec.model.fallbacks[{i}]", m) for i, m in fallbacks)]

    def label_of(self, name: str) -> str | None:
        """The `provider/name` of the model named `name` (or `provider/name`), if any."""
        index = self.index_of(name)
        return None if index is None else self.choices()[index][1].label

    def index_of(self, name: str) -> int | None:
        """The place in `choices` of the model named `name` (or `provider/name`), if any."""
        for index, (_, choice) in enumerate(self.choices()):
            if choice.is_named(name):
                return index
        return None

    @model_validator(mode="after")
    def _cooldown_with_fallbacks(self) -> ModelSpec:
        if self.cooldown is not None and not self.fallbacks:
            raise ValueError(
                "cooldown skips a model for the next of `fallbacks`, and there are none: "
                "add fallbacks or remove cooldown"
            )
        return self

    @model_validator(mode="after")
    def _one_secret_per_key_variable(self) -> ModelSpec:
        # The worker reads each key from one variable: two Secrets in it would be one lost.
        filled: dict[str, tuple[str, SecretKeyRef]] = {}
        for where, choice in self.choices():
            variable, ref = choice.key_variable, choice.api_key_secret_ref
            if variable is None or ref is None:
                continue
            first = filled.setdefault(variable, (where, ref))
            if first[1] != ref:
                raise ValueError(
                    f"{where} reads its API key from {variable}, which {first[0]} fills from "
                    "another Secret: give it an apiKeyEnv of its own"
                )
        return self


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_URL_LENGTH = 2048
NOTIFY_URL = r"^https?://"
URL_USERINFO = r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@"
URL_QUERY = r"[?#]"


class EnvVar(_Model):
    """An environment variable (plain values only; secrets come from the referenced Secrets)."""

    name: str = Field(pattern=ENV_NAME, description="Variable name.")
    value: str = Field(default="", description="Value.")


HEADER_NAME = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$"
CREDENTIAL_HEADER = re.compile(r"authorization|token|key|secret|cookie|password|credential", re.I)


CREDENTIAL_VARIABLE = re.compile(
    r"token|secret|password|passwd|credential|api_?key|private_?key|(^|_)(key|auth|pat)(_|$)", re.I
)


def mcp_variable(tool: str, name: str) -> str:
    """The worker's environment variable of an MCP server's header or variable kept in a
    Secret (by default)."""
    return "TETHER_MCP_" + re.sub(r"[^A-Za-z0-9]", "_", f"{tool}_{name}").upper()


class _SecretSourced(_Model):
    """A named value of an MCP server that may come from a Secret, through the worker's
    environment."""

    name: str
    value: str | None
    secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding the value; the operator maps it into the worker's "
        "environment (`env`), never into the ConfigMap, the status or an event.",
    )
    env: str | None = Field(
        default=None,
        pattern=ENV_NAME,
        description="The worker's environment variable holding the value (default "
        "TETHER_MCP_<TOOL>_<NAME>): filled from secretRef on Kubernetes; `tether run` and "
        "`tether worker` read it from their environment.",
    )

    @property
    def from_worker(self) -> bool:
        """Whether the value is read from the worker's environment (a Secret's)."""
        return self.secret_ref is not None or self.env is not None

    def variable(self, tool: str) -> str:
        """The worker's variable the value is read from (when `from_worker`)."""
        return self.env or mcp_variable(tool, self.name)

    _credential: ClassVar[re.Pattern[str]]
    """Names of values that are credentials, refused as plain `value`s."""
    _needs_value: ClassVar[bool]
    """Whether a plain `value` or a source must be given (else the value is empty)."""

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        given = self.value is not None
        if (given and self.from_worker) or (
            self._needs_value and not given and not self.from_worker
        ):
            raise ValueError("set `value`, or `secretRef` (with an optional `env`), not both")
        if self.value and self._credential.search(self.name):
            raise ValueError(
                f"{self.name} carries a credential, and `value` is stored in plain text in the "
                "DurableAgent and its ConfigMap: put it in a Secret and name it in `secretRef`"
            )
        return self


class McpHeader(_SecretSourced):
    """An HTTP header sent with every request to an MCP server. A credential (an
    Authorization header, a token, a key) comes from a Secret (`secretRef`)."""

    name: str = Field(pattern=HEADER_NAME, description="Header name, e.g. Authorization.")
    value: str | None = Field(
        default=None,
        max_length=4096,
        description="A plain value, stored in the DurableAgent and its ConfigMap: never a "
        "credential (refused for Authorization, cookies, tokens and keys).",
    )

    _credential = CREDENTIAL_HEADER
    _needs_value = True


class McpEnvVar(_SecretSourced):
    """An environment variable of a stdio MCP server, handed to that server alone. A
    credential (a token, a key, a password) comes from a Secret (`secretRef`)."""

    name: str = Field(
        pattern=ENV_NAME, max_length=128, description="Variable name, e.g. GITHUB_TOKEN."
    )
    value: str | None = Field(
        default=None,
        max_length=4096,
        description="A plain value (default: empty), stored in the DurableAgent and its "
        "ConfigMap: never a credential (refused for TOKEN, SECRET, PASSWORD, KEY...).",
    )

    _credential = CREDENTIAL_VARIABLE
    _needs_value = False


class McpToolOverride(_Model):
    """Settings of one tool of an MCP server that win over the server's annotations and the
    entry's settings."""

    replay: Literal["safe", "unsafe"] | None = Field(
        default=None, description="safe: may run again after a crash; unsafe: reported."
    )
    require_approval: bool | None = Field(
        default=None, description="Park each call of this tool until a person decides."
    )
    description: str | None = Field(default=None, description="Override the description.")


class McpSpec(_Model):
    """The tools of an MCP server: over streamable HTTP (or SSE) at `url`, or a stdio server
    started with `command` (for `tether run` and images that contain the server). The list is
    fetched in a journaled step at the start of each run, so a replay sees the tools the run
    started with. A tool the server marks readOnlyHint or idempotentHint runs again after a
    crash; any other is reported as interrupted (override with `replay`)."""

    url: str | None = Field(
        default=None,
        pattern=NOTIFY_URL,
        max_length=MAX_URL_LENGTH,
        description="The server's endpoint, e.g. http://github-mcp.tools:8080/mcp. Credentials "
        "go in `headers` from a Secret: a URL with user information or a query is refused.",
    )
    transport: Literal["streamable-http", "sse"] = Field(
        default="streamable-http",
        description="streamable-http, or sse for a server that has only the older transport.",
    )
    command: list[Annotated[str, Field(min_length=1)]] | None = Field(
        default=None,
        min_length=1,
        description="argv of a stdio server. It starts with `env` and a safe minimum of the "
        "worker's environment (PATH, HOME), never the worker's secrets.",
    )
    env: list[McpEnvVar] = Field(
        default_factory=list,
        max_length=64,
        description="Environment of a stdio server: plain values, and credentials from Secrets.",
    )
    headers: list[McpHeader] = Field(
        default_factory=list, max_length=32, description="HTTP headers of every request."
    )
    include: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="Tool names to take (shell-style patterns such as get_*); default: all.",
    )
    exclude: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Tool names (patterns) to leave out."
    )
    prefix: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9_-]{0,32}$",
        description="Put before each tool's name (two servers with a tool of the same name).",
    )
    tools: dict[str, McpToolOverride] = Field(
        default_factory=dict,
        description="Per tool, by the server's name for it: replay, requireApproval, description.",
    )
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig,
        description="How a stdio server is confined, as the shell built-in's commands are "
        "(Landlock and a seccomp filter): it reads the system's directories (readPaths), its "
        "own program and the files its command names by absolute path; reads and writes the "
        "workspace and a home made for each connection (its working directory, $HOME and "
        "$TMPDIR; writePaths adds more); connects over TCP to connectPorts only (53, 80, 443: "
        "not Restate's ingress); holds no capability. enabled: false runs it unconfined.",
    )

    @field_validator("url")
    @classmethod
    def _no_token(cls, value: str | None) -> str | None:
        if value is not None and (re.search(URL_USERINFO, value) or re.search(URL_QUERY, value)):
            raise ValueError(
                "this URL carries user information or a query, stored in plain text in the "
                "DurableAgent and its ConfigMap: send credentials as `headers` from a Secret"
            )
        return value

    @model_validator(mode="after")
    def _one_server(self) -> McpSpec:
        if (self.url is None) == (self.command is None):
            raise ValueError("set `url` (streamable HTTP or SSE) or `command` (stdio), not both")
        if self.command is not None and self.headers:
            raise ValueError("`headers` are for a server at a `url`; a stdio server takes `env`")
        if self.url is not None and self.env:
            raise ValueError("`env` is for a stdio server (`command`); a `url` takes `headers`")
        if self.url is not None and self.sandbox != SandboxConfig():  # the default: harmless
            raise ValueError(
                "`sandbox` confines a stdio server (`command`); a server at a `url` runs in "
                "its own process or pod (confine it there, and its reach with a NetworkPolicy)"
            )
        names = [h.name.lower() for h in self.headers]
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"headers repeated: {', '.join(repeated)}")
        return self


class ToolSpecEntry(_Model):
    """One tool: a built-in, a Python function by import path, or an MCP server's tools."""

    name: str = Field(pattern=TOOL_NAME, description="Name the model calls the tool by.")
    builtin: BuiltinTool | None = Field(
        default=None,
        description="A built-in tool: read_file, write_file, append_file, list_files (confined "
        "to the workspace), http_request (config: allowHosts, allowPorts [80, 443], allowCidrs "
        "for non-public addresses, timeoutSeconds, maxResponseBytes, idempotencyKey [true]: POST "
        "and PATCH carry an Idempotency-Key, the same at every attempt of a call), shell (config: "
        "timeoutSeconds, maxOutputBytes, killAfterOutputBytes, env, passEnv, limits: "
        "{cpuSeconds, memoryBytes, fileSizeBytes, processes}), ask_human (parks until a person "
        "answers).",
    )
    python: str | None = Field(
        default=None,
        pattern=IMPORT_PATH,
        description="Import path of a ToolDef or @tool function: 'package.module:attribute'.",
    )
    mcp: McpSpec | None = Field(
        default=None,
        description="The tools of an MCP server; `name` names the server (metrics, errors). "
        "replay, requireApproval and timeout apply to each of its tools.",
    )
    description: str | None = Field(default=None, description="Override the description.")
    config: dict[str, Any] = Field(default_factory=dict, description="Built-in tool settings.")
    replay: Literal["safe", "unsafe"] | None = Field(
        default=None,
        description="safe: may run again after a crash; unsafe: reported as interrupted.",
    )
    require_approval: bool = Field(
        default=False, description="Park each call until a person approves or denies it."
    )
    timeout: PositiveDuration | None = Field(
        default=None,
        description="Time before the call fails (an MCP server's: each call, and connecting "
        "and listing; default 60s).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ToolSpecEntry:
        if [self.builtin, self.python, self.mcp].count(None) != 2:
            raise ValueError("set exactly one of `builtin`, `python` or `mcp`")
        if self.mcp is not None and (self.description is not None or self.config):
            raise ValueError(
                "an `mcp` entry's tools keep their server's descriptions and take no `config`; "
                "override a tool's description in `mcp.tools.<tool>.description`"
            )
        return self


class SpendCapSpec(_Model):
    """At most so much spent by all of the agent's runs together in each calendar hour, day or
    month (UTC, or `timeZone`'s), on every worker and version: a model call that does not fit
    does not start, and its run ends with `budget_exceeded` or waits for the next period."""

    per: Per = Field(description="The calendar period: hour, day or month (in `timeZone`).")
    # Unset, not "UTC", by default: a new default would change every version's hash.
    time_zone: str | None = Field(
        default=None,
        max_length=64,
        pattern=ZONE_PATTERN,
        description="The IANA time zone whose calendar the periods follow (Asia/Tokyo: a day "
        "from midnight to midnight in Tokyo, 23 or 25 hours where the clocks change). Unset: "
        "UTC.",
        examples=["Europe/Paris"],
    )
    max_cost_usd: float | None = Field(
        default=None,
        gt=0,
        description="USD a period (needs the pricing of every model the cap counts).",
    )
    max_tokens: int | None = Field(default=None, gt=0, description="Tokens a period.")
    on_reached: Literal["stop", "wait"] | None = Field(
        default=None,
        description="When a model call does not fit, and the run has no fallback model left "
        "to ask (a refused call goes to the next one first): stop (the default) ends the run "
        "(budget_exceeded); wait has the run wait, durably, for the period to reset (a "
        "throttle), unless the call alone is larger than the cap.",
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Only the calls of this model count, and only they are refused: one of "
        "spec.model's or its fallbacks' (its name, or provider/name). A call it refuses goes "
        "to the run's next fallback model at once, as a failed call does; from the last model, "
        "it stops or waits. Unset: every call of the agent.",
    )

    @model_validator(mode="after")
    def _a_limit_and_a_zone(self) -> SpendCapSpec:
        if self.max_cost_usd is None and self.max_tokens is None:
            raise ValueError("a spend cap needs maxCostUsd or maxTokens")
        if self.time_zone is not None and (problem := zone_problem(self.time_zone)) is not None:
            raise ValueError(problem)
        return self


class Limits(_Model):
    """When a run stops on its own."""

    max_turns: int = Field(default=50, gt=0, description="Model calls per run.")
    max_cost_usd: float | None = Field(
        default=None,
        gt=0,
        description="Cost budget per run, its sub-agents included: every model call reserves "
        "its worst case first, and one that does not fit does not start (needs pricing).",
    )
    max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="Token budget per run, its sub-agents included, reserved like the cost.",
    )
    # Unset, not "stop", by default: a new default would change every version's hash.
    on_exhausted: Literal["stop", "ask"] | None = Field(
        default=None,
        description="When the next model call does not fit a budget: stop (the default) ends "
        "the run (budget_exceeded); ask waits for a person as for an approval (tool `budget`, "
        "listed and answered like any approval), and an approval raises each budget by its size.",
    )

    spend_caps: list[SpendCapSpec] | None = Field(
        default=None,
        max_length=len(PERIODS) * (2 + MAX_FALLBACKS),  # per period: the agent's, each model's
        description="Caps on what all of the agent's runs spend together in each calendar "
        "hour, day or month (UTC, or a cap's timeZone), one per period whatever its zone (and "
        "per model, for a model's own): every model call holds its worst case first, on "
        "Restate across all workers and versions (needs spec.webhook, whose key signs the "
        "holds), and one that does not fit does not start: its run goes to its next fallback "
        "model, and from the last one ends with budget_exceeded, saying when the period "
        "resets, or waits for it (onReached: wait).",
    )

    @model_validator(mode="after")
    def _ask_needs_a_budget(self) -> Limits:
        if self.on_exhausted == "ask" and self.max_cost_usd is None and self.max_tokens is None:
            raise ValueError("limits.onExhausted: ask needs limits.maxCostUsd or limits.maxTokens")
        return self


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


TOKEN_WEBHOOK = (
    r"^https?://(hooks\.slack\.com|([a-z0-9-]+\.)?discord(app)?\.com/api/webhooks"
    r"|[a-z0-9-]+\.webhook\.office\.com|outlook\.office(365)?\.com/webhook)([/:?#]|$)"
)
"""Incoming webhooks whose URL path is their token: Slack, Discord, Microsoft Teams."""
URL_WITH_TOKEN = (
    "carries a token (user information, a query, or a Slack, Discord or Teams incoming-webhook "
    "path), and this field is stored in plain text in the DurableAgent and its ConfigMap: put "
    "the URL in a Secret and name it in `urlSecretRef` instead (`urlEnv` outside Kubernetes)"
)


def url_token_problem(url: str) -> str | None:
    """Why `url` is a credential that must not sit in a manifest, or None."""
    if re.search(URL_USERINFO, url) or re.search(URL_QUERY, url):
        return URL_WITH_TOKEN
    if re.search(TOKEN_WEBHOOK, url, re.IGNORECASE):
        return URL_WITH_TOKEN
    return None


NotifyFormat = Literal["json", "slack"]


class ApprovalNotify(_Model):
    """Where to announce a call that waits for approval: a signed POST per parked call, with
    approve and deny links (`format: json`), or a Slack message with Approve and Deny buttons
    (`format: slack`). A URL with a token in it (a Slack incoming webhook carries one in its
    path) is a credential: keep it in a Secret and reference it with `urlSecretRef`."""

    url_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret holding the URL that receives a signed POST per parked call: the "
        "way to give it (required for a URL that carries a token, such as a Slack incoming "
        "webhook). The operator maps it into the worker's environment (urlEnv), never into the "
        "version's ConfigMap, the status or an event.",
    )
    url_env: str | None = Field(
        default=None,
        pattern=ENV_NAME,
        description=f"Environment variable holding the URL (default {NOTIFY_URL_ENV}): the "
        "operator fills it from urlSecretRef; `tether worker` and `tether dev` read it from "
        "their environment.",
    )
    url: str | None = Field(
        default=None,
        pattern=NOTIFY_URL,
        max_length=MAX_URL_LENGTH,
        description="A URL without a token (an in-cluster receiver that checks the request's "
        "signature, say): it is stored in plain text in the DurableAgent and the version's "
        "ConfigMap. A URL with a token belongs in a Secret (urlSecretRef); one with user "
        "information, a query, or a Slack, Discord or Teams webhook path is refused here.",
    )

    recipients: (
        list[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^\x00-\x1f\x7f]+$")]]
        | None
    ) = Field(
        default=None,
        max_length=50,
        description="The people who may decide (an email or a chat handle each): the POST then "
        "carries one pair of approve/deny links per person, each naming its recipient, who is "
        "recorded as the approver of a decision made with it.",
    )

    # None is json: a default that is not None would enter every rendered spec, and so change
    # the version hash of every agent with a notify block (a rollout on upgrade).
    format: NotifyFormat | None = Field(
        default=None,
        description="json (the default): a signed JSON POST with approve/deny links (any "
        "receiver); slack: the URL is a Slack incoming webhook, and each parked approval is a "
        "Block Kit message with Approve and Deny buttons, whose clicks Slack sends to the "
        "sidecar's /v1/slack/interactions (the Slack app's interactivity request URL), signed "
        "with the app's signing secret (slackSigningSecretRef).",
    )
    slack_signing_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="format slack: Secret holding the Slack app's signing secret, which "
        f"authenticates the button clicks; the operator maps it into the sidecar's "
        f"{SLACK_SIGNING_SECRET_ENV}. Without it the sidecar refuses every click.",
    )

    @field_validator("url")
    @classmethod
    def _no_token(cls, value: str | None) -> str | None:
        if value is not None and (problem := url_token_problem(value)):
            raise ValueError(f"this URL {problem}")  # the URL itself is not repeated
        return value

    @model_validator(mode="after")
    def _slack_fields(self) -> ApprovalNotify:
        if self.format != "slack" and self.slack_signing_secret_ref is not None:
            raise ValueError("`slackSigningSecretRef` is for `format: slack`")
        if self.format == "slack" and self.recipients:
            raise ValueError(
                "`recipients` is for `format: json` (a pair of links per person): with "
                "`format: slack`, whoever can press the message's buttons decides, and is "
                "recorded as the approver; choose the channel accordingly"
            )
        return self

    @model_validator(mode="after")
    def _one_source(self) -> ApprovalNotify:
        from_env = self.url_secret_ref is not None or self.url_env is not None
        if self.url is not None and from_env:
            raise ValueError("set `url` or `urlSecretRef` (with an optional `urlEnv`), not both")
        if self.url is None and not from_env:
            raise ValueError(
                "set `urlSecretRef` (a Secret holding the URL), or `url` for a URL without a token"
            )
        return self

    @property
    def url_variable(self) -> str:
        """The environment variable the worker reads the URL from (unless `url` is set)."""
        return self.url_env or NOTIFY_URL_ENV


class Approvals(_Model):
    """How calls that need a person's approval wait."""

    timeout: PositiveDuration = Field(
        default="1h", description="How long a call waits for a decision."
    )
    on_timeout: Literal["deny", "approve"] = Field(
        default="deny", description="deny: report a denied call to the model; approve: run it."
    )
    notify: ApprovalNotify | None = Field(
        default=None,
        description="Announce parked calls: a signed POST (or, with format slack, a Slack "
        "message with Approve and Deny buttons) to a URL kept in a Secret (urlSecretRef).",
    )


class OutputSpec(_Model):
    """The value each run ends with besides its text, of a JSON Schema (`tether.Output`)."""

    json_schema: dict[str, Any] = Field(
        alias="schema",
        description="The JSON Schema of the value. The model gives it as the input of the "
        "tool final_answer (an object's schema as it is; any other's as its `value`).",
    )
    retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="How many answers in a run may miss (text only, or a value that does not "
        "match: the model is told why) before it ends with status error.",
    )

    @field_validator("json_schema")
    @classmethod
    def _a_json_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = schema_problem(value)
        if problem is not None:
            raise ValueError(f"not a JSON Schema: {problem}")
        return value


class SubagentSpec(_Model):
    """A sub-agent the spawn tool starts by name (`tether.agent.Subagent`): a specialist with a
    prompt, tools, model and output of its own; what it leaves unset it has from the agent."""

    name: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="The name the model gives as the spawn tool's `agent`.",
    )
    description: str = Field(
        min_length=1,
        max_length=2048,
        description="What it is for: the model reads it in the spawn tool's description to choose.",
    )
    system: str | None = Field(default=None, description="Its system prompt (unset: the agent's).")
    tools: list[str] | None = Field(
        default=None,
        description="The names of the spec.tools it has (unset: all of them; []: none). It "
        "may spawn in turn while maxDepth allows.",
    )
    model: str | None = Field(
        default=None,
        description="One of the agent's models (spec.model's name or a fallback's, or "
        "provider/name): asked first, the others after it in their order (unset: the "
        "agent's order).",
    )
    output: OutputSpec | None = Field(
        default=None,
        description="A value it ends with, of a JSON Schema: its answer to the spawn call is "
        "the value's JSON.",
    )
    max_turns: int | None = Field(
        default=None, gt=0, description="Model calls per run of it (unset: limits.maxTurns)."
    )


class Subagents(_Model):
    """Sub-agents started by the spawn tool."""

    max_depth: int = Field(default=2, ge=0, le=8, description="How deep sub-agents may nest.")
    max_concurrent: int = Field(default=3, gt=0, description="Children running at once per call.")
    agents: list[SubagentSpec] = Field(
        default_factory=list,
        max_length=32,
        description="Named sub-agents a spawn call may choose (its `agent`); unset, a call "
        "starts one like the agent.",
    )


class Resources(_Model):
    """Compute resources of the worker container (Kubernetes quantities)."""

    requests: dict[str, str] = Field(default_factory=dict, description="e.g. {cpu: 100m}.")
    limits: dict[str, str] = Field(default_factory=dict, description="e.g. {memory: 512Mi}.")


OBJECT_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A Kubernetes object's name (a DNS subdomain)."""


class WorkerSpec(_Model):
    """The worker pods of each version."""

    image: str | None = Field(default=None, description="Worker image (default: operator's).")
    replicas: int = Field(
        default=1,
        ge=0,
        le=100,
        description="Worker pods per version: what a version starts with; replicas an "
        "autoscaler sets later (spec.scaling.activeRunsPerReplica, an HPA, KEDA) are kept.",
    )
    workspace_claim: str | None = Field(
        default=None,
        pattern=OBJECT_NAME,
        max_length=253,
        description="A PersistentVolumeClaim of the agent's namespace mounted as the workspace "
        "(/workspace, TETHER_WORKSPACE: where the file tools write) in every pod of every "
        "version, so files outlive pods and versions; several pods on several nodes need it "
        "ReadWriteMany. Unset: an emptyDir per pod. Tools of every session share it.",
    )
    resources: Resources = Field(
        default_factory=Resources, description="Requests and limits of the worker container."
    )
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables.")
    stop_grace_period: PositiveDuration | None = Field(
        default=None,
        description="How long a stopping worker pod (a rollout, a scale-down, a node drain) "
        "lets the model and tool calls in flight finish. Its runs leave it before their next "
        "model step, and it exits as soon as nothing runs; a call still running at the end is "
        "cut off (a model call is paid again, an unsafe tool call reported interrupted). Unset: "
        "a model call of maxTokens at 25 tokens/s, the longest tool call after it (its timeout; "
        "60s for a tool without one) and 5s, at most 30m. The pod's "
        "terminationGracePeriodSeconds is 5s longer.",
    )


class SidecarSpec(_Model):
    """The agent's sidecar pods: one Deployment for all its versions, up whichever versions
    have pods. They take the webhooks and approvals, serve the event stream and the metrics,
    and hold the index of the agent's parked calls and its live events on Restate."""

    replicas: int = Field(
        default=1,
        ge=1,
        le=10,
        description="Sidecar pods (2 or more: approvals are taken while one is replaced; an "
        "answer acts once through any of them).",
    )


class ObservabilitySpec(_Model):
    """Where the agent's traces go: OpenTelemetry, a trace per run (its turns, model and tool
    calls, waits for approval and sub-agents), exported over OTLP/HTTP by the worker."""

    otlp_endpoint: str | None = Field(
        default=None,
        pattern=NOTIFY_URL,
        max_length=MAX_URL_LENGTH,
        description="Base URL of an OTLP/HTTP collector, e.g. "
        "http://otel-collector.observability:4318 (the worker's OTEL_EXPORTER_OTLP_ENDPOINT; "
        "OTEL_SERVICE_NAME is the agent's name). Default: the operator's "
        "(`observability.otlpEndpoint` of the chart); neither: no traces. A URL with user "
        "information or a query is refused.",
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _no_token(cls, value: str | None) -> str | None:
        if value is not None and (re.search(URL_USERINFO, value) or re.search(URL_QUERY, value)):
            raise ValueError(
                "this URL carries user information or a query, stored in plain text in the "
                "DurableAgent and its Deployment: give the collector's address alone"
            )
        return value


class WebhookSpec(_Model):
    """The secret that signs approval links and authenticates webhook resolutions."""

    secret_ref: SecretKeyRef = Field(description="Secret holding the webhook HMAC key.")
    previous_secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="During a rotation: the key being replaced, still accepted (never used to "
        "sign). Remove it once every sender signs with the new key.",
    )


class DrainSpec(_Model):
    """How an old version is retired after a change."""

    delay: Duration = Field(default="5m", description="Wait at least this long before removal.")
    timeout: Duration = Field(
        default="24h",
        description="Remove the version after this long even with runs pinned: they are "
        "cancelled first, and killed 5 minutes later if still there (no other version can take "
        "them over, and each would hold its session).",
    )


class ScalingSpec(_Model):
    """How many worker pods a version has: as many as its active runs need (autoscaling), and
    none once its runs have only waited (for a person, a timer, another call) long enough.
    Waiting runs hold no worker memory; Restate keeps them, and the version stays registered."""

    idle_after: PositiveDuration | None = Field(
        default=None,
        description="Scale a version's Deployment to zero replicas once Restate has shown no "
        "run of it running, ready or backing off for this long (suspended and paused "
        "runs wait without pods), the active version's too (the agent's sidecar Deployment "
        "takes the webhooks meanwhile); it keeps its Restate registration and is scaled back to "
        "its replicas as soon as one of its runs has work again (an approval answered, for the "
        "active version a new run), and its paused runs are resumed. Unset: never scale to "
        "zero.",
    )
    min_replicas: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="Fewest worker pods a version has while its runs are active (the "
        "operator's with activeRunsPerReplica, else an HPA's or KEDA's on the operator's "
        "tether_version_active_runs gauge); a version woken from zero gets at least this many.",
    )
    max_replicas: int | None = Field(
        default=None,
        ge=1,
        le=100,
        description="Most worker pods a version has while its runs are active; a version woken "
        "from zero gets at most this many. Required with activeRunsPerReplica.",
    )
    active_runs_per_replica: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Autoscale: the operator gives each version with pods ceil(its active runs "
        "/ this) of them (running, ready, backing off or pending in Restate, counted at most "
        "10 s ago), within minReplicas and maxReplicas: more at once, fewer once the lower "
        "count has held for scaleDownAfter. It then owns the Deployments' replicas, and "
        "worker.replicas is only what a new version starts with. Unset: versions keep "
        "worker.replicas (or what an HPA or KEDA gives them).",
    )
    scale_down_after: Duration = Field(
        default="5m",
        description="With activeRunsPerReplica: how long a version's active runs must have "
        "needed fewer pods before it loses any (the most they needed in this window is kept), "
        "so a burst that comes and goes does not churn pods.",
    )

    @model_validator(mode="after")
    def _bounds_in_order(self) -> ScalingSpec:
        low, high = self.min_replicas, self.max_replicas
        if low is not None and high is not None and low > high:
            raise ValueError("minReplicas must not be greater than maxReplicas")
        if self.active_runs_per_replica is not None and high is None:
            raise ValueError("activeRunsPerReplica needs maxReplicas")
        return self

    def autoscaled(self, active_runs: int) -> int:
        """The replicas `active_runs` need with `active_runs_per_replica`, within the bounds."""
        assert self.active_runs_per_replica is not None
        return self.bounded(-(-active_runs // self.active_runs_per_replica))

    def bounded(self, replicas: int) -> int:
        """`replicas` within minReplicas and maxReplicas, and at least 1."""
        low = max(self.min_replicas or 1, 1)
        high = self.max_replicas if self.max_replicas is not None else max(replicas, low)
        return min(max(replicas, low), high)


class EventsSpec(_Model):
    """How much of each session's event stream is kept (`GET /v1/sessions/<session>/events`)."""

    retain: int = Field(
        default=10_000,  # tether.session.events.DEFAULT_RETAIN
        ge=100,
        le=1_000_000,
        description="Durable events kept per session, readable after its runs (100 to "
        "1000000); past it the oldest go first, 16 at a time (fewer are kept when events "
        "average over 1 KiB: a segment holds 16 events or 16 KiB).",
    )
    live_batches: int = Field(
        default=50,  # tether.programs.worker.live.KEEP_BATCHES
        ge=1,
        le=1000,
        description="Batches of live events (model text, tool calls started) kept per session "
        "for a client that reconnects mid-call (1 to 1000).",
    )


class ScheduleSpec(_Model):
    """Runs started at the times of a cron expression (`<agent>-schedule/<name>` on Restate,
    kept by the operator). A time's run starts at most once; one that cannot start before the
    schedule's next time (its session is still busy, or Restate was down) is skipped, and the
    next time's run takes its place."""

    name: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        max_length=63,
        description="The schedule's name, unique in the agent.",
    )
    cron: str = Field(
        description=f"When its runs are due: {EXPRESSION_HELP}.",
        examples=["0 9 * * 1-5"],
    )
    time_zone: str = Field(
        default="UTC",
        max_length=64,
        pattern=ZONE_PATTERN,
        description="The IANA time zone the cron expression is read in.",
    )
    prompt: str = Field(min_length=1, description="The task each run is given.")
    session: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$",
        description="A session every run continues, one run at a time (unset: each run starts "
        "a session of its own, `<name>-<time>` in UTC, and runs of different times may overlap).",
    )
    suspend: bool = Field(default=False, description="Start no runs until it is set false again.")

    @model_validator(mode="after")
    def _is_due_sometime(self) -> ScheduleSpec:
        problem = cron_problem(self.cron, self.time_zone)
        if problem is not None:
            raise ValueError(problem)
        return self


class DurableAgentSpec(_Model):
    """The agent: model, prompt, tools, limits and how it is deployed."""

    model: ModelSpec = Field(description="Which model answers, and how to reach it.")
    system: str | None = Field(default=None, description="System prompt.")
    tools: list[ToolSpecEntry] = Field(default_factory=list, description="Tools the agent has.")
    approvals: Approvals = Field(
        default_factory=Approvals, description="How calls that need approval wait."
    )
    subagents: Subagents | None = Field(
        default=None, description="Enables the spawn tool for sub-agents."
    )
    limits: Limits = Field(default_factory=Limits, description="When a run stops on its own.")
    behavior: BehaviorSpec = Field(
        default_factory=BehaviorSpec, description="How the agent loop behaves."
    )
    worker: WorkerSpec = Field(
        default_factory=WorkerSpec, description="The worker pods of each version."
    )
    sidecar: SidecarSpec = Field(
        default_factory=SidecarSpec,
        description="The agent's sidecar pods, shared by its versions.",
    )
    webhook: WebhookSpec | None = Field(default=None, description="Webhook signing secret.")
    drain: DrainSpec = Field(
        default_factory=DrainSpec, description="How an old version is retired after a change."
    )
    scaling: ScalingSpec | None = Field(
        default=None,
        description="When a draining version's pods go while its runs only wait (scale to "
        "zero), and the bounds of an autoscaler's replicas. Unset: versions keep their "
        "replicas.",
    )
    observability: ObservabilitySpec | None = Field(
        default=None, description="Where the agent's traces go (OpenTelemetry)."
    )
    events: EventsSpec | None = Field(
        default=None, description="How much of each session's event stream is kept."
    )
    output: OutputSpec | None = Field(
        default=None,
        description="A value each run ends with, of a JSON Schema (the run's `output`), given "
        "by the model through the tool final_answer. Unset: runs end with text.",
    )
    schedules: list[ScheduleSpec] = Field(
        default_factory=list,
        description="Runs started at the times of cron expressions; needs spec.webhook, whose "
        "key signs what the operator tells Restate of them.",
    )

    def secret_variables(self) -> list[str]:
        """The variables the worker reads secrets from, besides its own: the models' API keys,
        the notify URL's, MCP servers' headers' and variables'."""
        names = self._worker_secret_variables()
        names.extend(item.variable(entry.name) for _, entry, item in self._mcp_credentials())
        return list(dict.fromkeys(names))

    def _worker_secret_variables(self) -> list[str]:
        """The models' API keys' variables and the notify URL's."""
        names = [choice.key_variable for _, choice in self.model.choices()]
        notify = self.approvals.notify
        if notify is not None and notify.url is None:
            names.append(notify.url_variable)
        return [name for name in names if name]

    def _mcp_credentials(self) -> list[tuple[int, ToolSpecEntry, _SecretSourced]]:
        """MCP servers' headers and variables read from the worker's environment, with their
        tool's index and entry."""
        return [
            (index, entry, item)
            for index, entry in enumerate(self.tools)
            if entry.mcp is not None
            for item in [*entry.mcp.headers, *entry.mcp.env]
            if item.from_worker
        ]

    def mcp_secrets(self) -> list[tuple[str, SecretKeyRef, str]]:
        """The Secrets of MCP servers' headers and variables: the field naming each, its
        reference, and the variable the worker reads it from."""
        found = []
        for index, entry in enumerate(self.tools):
            if entry.mcp is None:
                continue
            named: list[tuple[str, Sequence[McpHeader | McpEnvVar]]] = [
                ("headers", entry.mcp.headers),
                ("env", entry.mcp.env),
            ]
            for field, items in named:
                for number, item in enumerate(items):
                    if item.secret_ref is not None:
                        where = f"spec.tools[{index}].mcp.{field}[{number}].secretRef"
                        found.append((where, item.secret_ref, item.variable(entry.name)))
        return found

    @model_validator(mode="after")
    def _budget_fits_a_call(self) -> DurableAgentSpec:
        self._fits_one_call("limits.", self.limits.max_tokens, self.limits.max_cost_usd)
        return self

    def _fits_one_call(
        self, where: str, max_tokens: int | None, cost_usd: float | None, only: str | None = None
    ) -> None:
        """Every model call holds its output first, against a run's budget (`limits.`) and the
        agent's spend caps (`only` a model's): a limit below one call's output lets no call
        start, which is a mistake to say now rather than a run that stops at once."""
        for at, model in self.model.choices():
            if only is not None and not model.is_named(only):
                continue
            field = at.removeprefix("spec.")
            output = model.max_tokens + (self.behavior.thinking_budget or 0)
            if max_tokens is not None and max_tokens <= output:
                raise ValueError(
                    f"{where}maxTokens ({max_tokens}) must be larger than one call's output "
                    f"({field}.maxTokens plus behavior.thinkingBudget: {output}): each call "
                    "holds it before it starts, so no call could"
                )
            pricing = model.pricing
            if cost_usd is not None and pricing is not None:
                most = output * pricing.output_per_m_tok / 1_000_000
                if cost_usd <= most:
                    raise ValueError(
                        f"{where}maxCostUsd ({cost_usd}) must be more than one call of {field} "
                        f"can cost ({output} tokens at {pricing.output_per_m_tok} USD per "
                        "million): each call holds it before it starts, so no call could"
                    )

    @model_validator(mode="after")
    def _no_server_given_anothers_secret(self) -> DurableAgentSpec:
        # A server's header or variable read from the worker's environment is its own: not a
        # secret of the worker's (with the webhook secret a server could approve), nor another
        # server's.
        credentials = self._mcp_credentials()
        worker = {*WORKER_SECRET_ENV, *self._worker_secret_variables()}
        taken = Counter(item.variable(entry.name) for _, entry, item in credentials)
        for index, entry, item in credentials:
            variable = item.variable(entry.name)
            if variable in worker or taken[variable] > 1:
                whose = "of the worker's own" if variable in worker else "of another of its values"
                raise ValueError(
                    f"spec.tools[{index}].mcp: {variable} is a secret {whose}, never sent to an "
                    "MCP server as this one; give each header or variable a credential of its "
                    "own (a secretRef)"
                )
        return self

    @model_validator(mode="after")
    def _no_secret_passed_to_a_command(self) -> DurableAgentSpec:
        # `shell` refuses the worker's own secrets by name; these are the spec's.
        secrets = set(self.secret_variables())
        for index, entry in enumerate(self.tools):
            config = entry.config if entry.builtin == "shell" else {}
            passed = config.get("passEnv", config.get("pass_env"))
            names = {n for n in passed if isinstance(n, str)} if isinstance(passed, list) else ()
            leaked = sorted(secrets.intersection(names))
            if leaked:
                raise ValueError(
                    f"spec.tools[{index}].config.passEnv: {', '.join(leaked)} holds a secret "
                    "the spec gives the worker, never passed to a command (with it the agent "
                    "could act as the worker); give the command a credential of its own under "
                    "another name"
                )
        return self

    @model_validator(mode="after")
    def _unique_tool_names(self) -> DurableAgentSpec:
        names = [t.name for t in self.tools]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(duplicates)}")
        agents = self.subagents.agents if self.subagents else []
        if OUTPUT_TOOL in names and (self.output or any(a.output for a in agents)):
            raise ValueError(
                f"a tool is named {OUTPUT_TOOL}, the name of the tool that gives the output: "
                "rename it"
            )
        return self

    @model_validator(mode="after")
    def _spend_caps_can_count(self) -> DurableAgentSpec:
        caps = self.limits.spend_caps or []
        choices = [choice for _, choice in self.model.choices()]
        periods: list[tuple[str, str | None]] = []  # each cap's period and model's label
        for cap in caps:
            label = None
            if cap.model is not None:
                named = {choice.label for choice in choices if choice.is_named(cap.model)}
                if len(named) != 1:
                    labels = [choice.label for choice in choices]
                    raise ValueError(
                        f"limits.spendCaps ({cap.per}): model {cap.model!r} is "
                        f"{'more than one' if named else 'none'} of the spec's models "
                        f"({', '.join(labels)}): name one by its provider/name"
                    )
                [label] = named
            periods.append((cap.per, label))
        if len(set(periods)) != len(periods):
            raise ValueError(
                "limits.spendCaps: one cap per period (hour, day, month), and per model"
            )
        if caps and self.webhook is None:
            raise ValueError(
                "limits.spendCaps needs spec.webhook: its key signs each call's hold, which "
                "the agent's own tools could otherwise take or give back"
            )
        for cap in caps:
            for where, model in self.model.choices():
                counted = cap.model is None or model.is_named(cap.model)
                if counted and cap.max_cost_usd is not None and model.pricing is None:
                    raise ValueError(
                        f"limits.spendCaps ({cap.per}): maxCostUsd needs "
                        f"{where.removeprefix('spec.')}.pricing, or its calls would cost nothing "
                        "against the cap"
                    )
            self._fits_one_call(
                f"limits.spendCaps ({cap.per}): ", cap.max_tokens, cap.max_cost_usd, cap.model
            )
        return self

    @model_validator(mode="after")
    def _schedules_are_signed_and_named_once(self) -> DurableAgentSpec:
        names = [schedule.name for schedule in self.schedules]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(
                f"spec.schedules: names must be unique; repeated: {', '.join(repeated)}"
            )
        if self.schedules and self.webhook is None:
            raise ValueError(
                "spec.schedules needs spec.webhook: its key signs the schedules the operator "
                "gives Restate, which the agent's own tools could otherwise change"
            )
        return self

    @model_validator(mode="after")
    def _subagents_name_what_exists(self) -> DurableAgentSpec:
        agents = self.subagents.agents if self.subagents else []
        seen: set[str] = set()
        tools = {t.name for t in self.tools}
        for index, agent in enumerate(agents):
            where = f"spec.subagents.agents[{index}]"
            if agent.name in seen:
                raise ValueError(f"{where}.name: {agent.name!r} is the name of another one")
            seen.add(agent.name)
            unknown = sorted(set(agent.tools or ()) - tools)
            if unknown:
                raise ValueError(
                    f"{where}.tools: {', '.join(unknown)} is not among spec.tools "
                    f"({', '.join(sorted(tools)) or 'none'})"
                )
            if agent.model is not None and self.model.index_of(agent.model) is None:
                models = ", ".join(choice.label for _, choice in self.model.choices())
                raise ValueError(
                    f"{where}.model: {agent.model!r} is not one of the agent's models ({models})"
                )
        return self


ConditionType = Literal["Ready", "Registered", "Progressing", "Draining"]


class Condition(_Model):
    """A Kubernetes status condition."""

    type: str = Field(description="Ready, Registered, Progressing or Draining.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(default="", description="What happened, for people.")
    last_transition_time: str = Field(description="RFC 3339 time of the last status change.")
    observed_generation: int | None = Field(default=None, description="Generation it refers to.")


class VersionStatus(_Model):
    """One deployed version of the agent."""

    hash: str = Field(description="Hash of the agent spec and pod template.")
    state: Literal["Pending", "Active", "Draining", "Removed"] = Field(
        description="Pending: deployed, not registered yet; Active: takes new runs; Draining: "
        "serves only the runs pinned to it; Removed: unregistered and deleted."
    )
    restate_deployment_id: str | None = Field(default=None, description="Restate deployment.")
    in_flight: int = Field(default=0, ge=0, description="Invocations still pinned to it.")
    created_at: str | None = Field(default=None, description="When the version was created.")
    draining_since: str | None = Field(
        default=None, description="When the version stopped taking new runs (RFC 3339)."
    )
    url: str | None = Field(default=None, description="The URL Restate reaches the version at.")
    active_runs: int | None = Field(
        default=None,
        ge=0,
        description="Runs pinned to it that are running, ready, backing off or pending.",
    )
    parked_runs: int | None = Field(
        default=None,
        ge=0,
        description="Runs pinned to it that wait without a pod: suspended (for a person, a "
        "timer or another call) or paused.",
    )
    replicas: int | None = Field(
        default=None,
        ge=0,
        description="Worker pods the operator wants for it now: its replicas, or 0 while it is "
        "scaled to zero (see scaledToZeroAt).",
    )
    idle_since: str | None = Field(
        default=None,
        description="Since when none of its runs is active (RFC 3339); with spec.scaling."
        "idleAfter, a draining version is scaled to zero after that long.",
    )
    scaled_to_zero_at: str | None = Field(
        default=None,
        description="When it was scaled to zero replicas for being idle (RFC 3339); unset "
        "while it has pods.",
    )
    woke_at: str | None = Field(
        default=None,
        description="When it was last scaled back up from zero because a run had work again "
        "(RFC 3339).",
    )


class SidecarStatus(_Model):
    """The agent's sidecar pods: webhooks and approvals, metrics, and on Restate the index of
    its parked calls and its live events, whichever versions have pods."""

    hash: str = Field(description="Hash of the sidecar's pod template and spec.")
    restate_deployment_id: str | None = Field(
        default=None, description="Its Restate deployment (the index of parked calls, live events)."
    )
    url: str | None = Field(default=None, description="Where Restate reaches it.")


class ScheduleStatus(_Model):
    """A schedule as the operator last set it on Restate (`<agent>-schedule/<name>`)."""

    name: str = Field(description="The schedule's name.")
    hash: str = Field(description="Hash of the schedule as set: set again when the spec's differs.")
    next_run: str | None = Field(
        default=None, description="When its next run is due (RFC 3339); none while suspended."
    )
    last_run: str | None = Field(
        default=None, description="When its last run was due (or was asked for: run-now)."
    )
    last_session: str | None = Field(default=None, description="The session of its last run.")
    late_ticks: int = Field(
        default=0,
        ge=0,
        description="How many times it came late (Restate was down) and ran only the latest "
        "time due.",
    )


class SpendStatus(_Model):
    """What the agent's runs spent in the current period of one of its spend caps, as Restate
    counts it (`<agent>-spend/all`); calls in flight are counted once they return."""

    per: Per = Field(description="The cap's period: hour, day or month (in its time zone).")
    model: str | None = Field(
        default=None, description="The model whose calls the cap counts (provider/name)."
    )
    period: str = Field(
        description="The current period (`day:2026-12-06`; `day:2026-12-07@Asia/Tokyo` in a zone)."
    )
    resets_at: str = Field(description="When the period ends (RFC 3339).")
    cost_usd: float = Field(default=0.0, ge=0, description="USD spent in it.")
    tokens: int = Field(default=0, ge=0, description="Tokens spent in it.")
    used: float = Field(
        default=0.0,
        ge=0,
        description="The larger share of the cap's limits spent (1: the cap is reached).",
    )


class DurableAgentStatus(_Model):
    """What the operator observed and did."""

    phase: Literal["Pending", "Progressing", "Ready", "Degraded", "Deleting"] = Field(
        default="Pending",
        description="Pending, Progressing (a new version rolls out), Ready, Degraded (see the "
        "conditions) or Deleting (draining before removal).",
    )
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation the status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Registered, Progressing and Draining."
    )
    versions: list[VersionStatus] = Field(
        default_factory=list, description="The deployed versions, newest first."
    )
    active_version: str | None = Field(
        default=None, description="Hash of the version that takes new runs."
    )
    ready_versions: str | None = Field(
        default=None, description="Registered versions with available pods, of all versions."
    )
    endpoint: str | None = Field(default=None, description="Ingress path that starts runs.")
    webhook_url: str | None = Field(default=None, description="Base URL of the approval hooks.")
    parked_calls: int = Field(default=0, ge=0, description="Calls waiting for a person.")
    sidecar: SidecarStatus | None = Field(default=None, description="The agent's sidecar pods.")
    schedules: list[ScheduleStatus] = Field(
        default_factory=list, description="The spec's schedules as set on Restate."
    )
    spend: list[SpendStatus] = Field(
        default_factory=list, description="What the runs spent in each spend cap's period."
    )
    run_now: str | None = Field(
        default=None,
        description="The last value of the annotation tether.dev/run-now that the operator "
        "handled: a schedule's run started at once (events RanNow, RunNowFailed).",
    )


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    namespace: str | None = None


class RestateServices(NamedTuple):
    """The Restate services an agent's worker and sidecar serve; Restate's service names are
    shared by all namespaces, so the operator checks that no other agent serves any of them."""

    agent: str
    """The agent's object: one session per key."""
    inbox: str
    """Messages for its running sessions (`tether.programs.worker.inbox`)."""
    parked: str
    """The index of its parked calls, read by its sidecars
    (`tether.programs.worker.parked_index`)."""
    live: str
    """The live events of its sessions (`tether.programs.worker.live`)."""
    watchers: str
    """The sessions clients stream, whose live events are sent (`tether.programs.worker.live`),
    under its one key `WATCHERS_KEY`."""
    budget: str
    """The budget ledgers of its root runs, with sub-agents (`tether.restate.budget`)."""
    handoff: str
    """Tool results handed from one worker replica to another, by intent
    (`tether.programs.worker.handoff`)."""
    pace: str
    """The slots of the calls of its models with a rate limit, by model
    (`tether.programs.worker.pace`)."""
    schedule: str
    """The schedules that start its runs, by name (`tether.programs.worker.schedule`)."""
    spend: str
    """What its runs spend together, held to its spend caps, under its one key `SPEND_KEY`
    (`tether.programs.worker.spend`)."""

    @property
    def of_versions(self) -> tuple[str, ...]:
        """Those its versions serve; the others, which the runs of every version share, are
        served by its sidecar's index (`tether.programs.worker.served`)."""
        return (self.agent,)


WATCHERS_KEY = "all"
"""The one key of `RestateServices.watchers`: the sidecars register there, the workers ask there."""
SPEND_KEY = "all"
"""The one key of `RestateServices.spend`."""


def restate_services(agent: str) -> RestateServices:
    return RestateServices(
        agent,
        f"{agent}-inbox",
        f"{agent}-parked",
        f"{agent}-live",
        f"{agent}-watchers",
        f"{agent}-budget",
        f"{agent}-handoff",
        f"{agent}-pace",
        f"{agent}-schedule",
        f"{agent}-spend",
    )


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
