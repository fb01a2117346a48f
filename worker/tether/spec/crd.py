"""The `DurableAgent` CustomResourceDefinition, generated from the pydantic models in `spec`.

`durableagent_crd()` turns the JSON Schema pydantic emits into the structural OpenAPI v3 schema
Kubernetes wants: references inlined, no `title`, `Optional[X]` collapsed into `X` (the API
server prunes an explicit `null` and applies the default, so `image: null` means "the default"),
`exclusiveMinimum` in the OpenAPI 3.0 boolean form, free-form maps marked
`x-kubernetes-preserve-unknown-fields`. Rules a schema cannot state are CEL
`x-kubernetes-validations` whose messages name the field. `crds/durableagent.yaml` is this
function's output (`tether crd`); a test keeps the two equal.
"""

from __future__ import annotations

from typing import Any

import yaml

from ..secret_env import WORKER_SECRET_ENV
from . import (
    API_VERSION,
    CREDENTIAL_HEADER,
    CREDENTIAL_VARIABLE,
    KIND,
    TOKEN_WEBHOOK,
    URL_QUERY,
    URL_USERINFO,
    URL_WITH_TOKEN,
    DurableAgentSpec,
    DurableAgentStatus,
)

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "durableagents"
SINGULAR = "durableagent"
SHORT_NAMES = ["da"]
CRD_NAME = f"{PLURAL}.{GROUP}"

#: Bounds that keep the cost of the CEL rules below the API server's budget.
MAX_TOOLS = 64
MAX_NAME_LENGTH = 52
"""An agent name leaves room for `-<10-character version hash>` in a 63-character Service name."""

_DROP = {"title", "$defs", "additionalProperties", "discriminator"}

Schema = dict[str, Any]


# ------------------------------------------------------------------------------------------
# JSON Schema (pydantic) -> structural OpenAPI v3 (Kubernetes)


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline a `$ref` (and a single-element `allOf`), keeping the referring node's keywords."""
    if "allOf" in node and len(node["allOf"]) == 1:
        rest = {k: v for k, v in node.items() if k != "allOf"}
        return _resolve({**node["allOf"][0], **rest}, defs)
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        rest = {k: v for k, v in node.items() if k != "$ref"}
        # The field's own description and default win over the model's docstring.
        return _resolve({**target, **rest}, defs)
    return node


def _without_null(node: Schema, defs: dict[str, Schema]) -> Schema:
    """`anyOf: [X, {type: null}]` (pydantic's `X | None`) -> `X`."""
    options = node.get("anyOf")
    if not options:
        return node
    kept = [o for o in options if o.get("type") != "null"]
    if len(kept) != 1:
        raise ValueError(f"cannot express a union of {len(kept)} types in a structural schema")
    rest = {k: v for k, v in node.items() if k != "anyOf"}
    merged = {**_resolve(kept[0], defs), **rest}
    if merged.get("default", 0) is None:
        del merged["default"]
    return merged


def _structural(node: Schema, defs: dict[str, Schema]) -> Schema:
    node = _without_null(_resolve(node, defs), defs)
    out: Schema = {k: v for k, v in node.items() if k not in _DROP}
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    for bound, keyword in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in out and not isinstance(out[bound], bool):
            out[keyword] = out[bound]
            out[bound] = True

    kind = out.get("type")
    if kind == "object":
        properties = node.get("properties")
        extra = node.get("additionalProperties")
        if properties:
            out["properties"] = {
                name: _structural(child, defs) for name, child in properties.items()
            }
            required = [r for r in node.get("required", []) if "default" not in properties[r]]
            if required:
                out["required"] = required
            else:
                out.pop("required", None)
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = _structural(extra, defs)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    elif kind == "array":
        out["items"] = _structural(node["items"], defs)
    elif kind is None and "enum" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "description" in out:
        out["description"] = " ".join(out["description"].split())
    return _ordered(out)


def _ordered(node: Schema) -> Schema:
    """`type` and `description` first, so the YAML reads like a reference."""
    first = [k for k in ("type", "description") if k in node]
    return {**{k: node[k] for k in first}, **{k: v for k, v in node.items() if k not in first}}


def _openapi(model: type[DurableAgentSpec] | type[DurableAgentStatus]) -> Schema:
    document = model.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    return _structural(document, document.get("$defs", {}))


# ------------------------------------------------------------------------------------------
# What the schema cannot say


def _rule(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _cel_string(text: str) -> str:
    """`text` as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _add_rules(node: Schema, *rules: dict[str, str]) -> None:
    node.setdefault("x-kubernetes-validations", []).extend(rules)


def _spec_schema() -> Schema:
    spec = _openapi(DurableAgentSpec)
    props = spec["properties"]

    model = props["model"]
    _add_rules(
        model,
        _rule(
            "self.provider == 'scripted' || has(self.apiKeySecretRef)",
            "spec.model.apiKeySecretRef is required for provider anthropic or openai: name the "
            "Secret and key that hold the API key",
            ".apiKeySecretRef",
        ),
        _rule(
            "!has(self.script) || self.provider == 'scripted'",
            "spec.model.script is only for provider scripted",
            ".script",
        ),
        _rule(
            "self.provider != 'scripted' || (has(self.script) && size(self.script) > 0)",
            "spec.model.script is required for provider scripted: a list of responses",
            ".script",
        ),
    )

    tools = props["tools"]
    tools["maxItems"] = MAX_TOOLS
    tool = tools["items"]
    tool["properties"]["name"]["maxLength"] = 64
    tool["properties"]["python"]["maxLength"] = 256
    _add_rules(
        tools,
        _rule(
            "self.all(t, self.filter(u, u.name == t.name).size() == 1)",
            "spec.tools: tool names must be unique",
        ),
    )
    _add_rules(
        tool,
        _rule(
            "(has(self.builtin) ? 1 : 0) + (has(self.python) ? 1 : 0) + (has(self.mcp) ? 1 : 0) "
            "== 1",
            "spec.tools[]: set exactly one of builtin, python or mcp",
        ),
        _rule(
            "!has(self.mcp) || !has(self.description)",
            "spec.tools[]: an mcp entry's tools keep their server's descriptions; override one "
            "in mcp.tools.<tool>.description",
        ),
    )
    mcp = tool["properties"]["mcp"]
    _add_rules(
        mcp,
        _rule(
            "has(self.url) != has(self.command)",
            "spec.tools[].mcp: set url (streamable HTTP or SSE) or command (stdio), not both",
        ),
        _rule(
            "!has(self.command) || !has(self.headers) || size(self.headers) == 0",
            "spec.tools[].mcp.headers are for a server at a url; a stdio server takes env",
        ),
        _rule(
            "!has(self.url) || !has(self.sandbox)",
            "spec.tools[].mcp.sandbox confines a stdio server (command); a server at a url "
            "runs in its own process or pod",
        ),
    )
    credential_free = " && ".join(
        f"!self.matches({_cel_string(pattern)})" for pattern in (URL_USERINFO, URL_QUERY)
    )
    _add_rules(
        mcp["properties"]["url"],
        _rule(
            credential_free,
            "spec.tools[].mcp.url carries user information or a query, stored in plain text: "
            "send credentials as headers from a Secret",
        ),
    )
    header = mcp["properties"]["headers"]["items"]
    header["properties"]["name"]["maxLength"] = 128
    _add_rules(
        header,
        _rule(
            "has(self.value) != (has(self.secretRef) || has(self.env))",
            "spec.tools[].mcp.headers[]: set value, or secretRef (with an optional env)",
        ),
        _rule(
            "!has(self.value) || !self.name.matches("
            + _cel_string(f"(?i){CREDENTIAL_HEADER.pattern}")
            + ")",
            "spec.tools[].mcp.headers[]: this header carries a credential; put it in a Secret "
            "and name it in secretRef",
        ),
    )
    _add_rules(
        mcp["properties"]["env"]["items"],
        _rule(
            "!has(self.value) || !(has(self.secretRef) || has(self.env))",
            "spec.tools[].mcp.env[]: set value, or secretRef (with an optional env), not both",
        ),
        _rule(
            "!has(self.value) || size(self.value) == 0 || !self.name.matches("
            + _cel_string(f"(?i){CREDENTIAL_VARIABLE.pattern}")
            + ")",
            "spec.tools[].mcp.env[]: this variable looks like a credential; put it in a Secret "
            "and name it in secretRef",
        ),
    )
    worker_secrets = ", ".join(_cel_string(name) for name in WORKER_SECRET_ENV)
    for node, where in ((header, "headers"), (mcp["properties"]["env"]["items"], "env")):
        _add_rules(
            node["properties"]["env"],
            _rule(
                f"!(self in [{worker_secrets}])",
                f"spec.tools[].mcp.{where}[].env names a secret of the worker's own, never sent "
                "to an MCP server",
            ),
        )
    sandbox = mcp["properties"]["sandbox"]
    for paths in ("readPaths", "writePaths"):
        sandbox["properties"][paths]["items"]["pattern"] = "^/"
    _add_rules(
        sandbox,
        _rule(
            "!has(self.required) || !self.required || !has(self.enabled) || self.enabled",
            "spec.tools[].mcp.sandbox: required: true asks for a sandbox that enabled: false "
            "turns off",
        ),
    )
    for node, where in (
        (tool["properties"]["timeout"], "spec.tools[].timeout"),
        (props["approvals"]["properties"]["timeout"], "spec.approvals.timeout"),
        (props["worker"]["properties"]["stopGracePeriod"], "spec.worker.stopGracePeriod"),
        (props["scaling"]["properties"]["idleAfter"], "spec.scaling.idleAfter"),
    ):
        _add_rules(
            node, _rule("duration(self) > duration('0s')", f"{where} must be longer than 0s")
        )
    notify = props["approvals"]["properties"]["notify"]
    _add_rules(
        notify,
        _rule(
            "has(self.url) ? !has(self.urlSecretRef) && !has(self.urlEnv) : has(self.urlSecretRef)",
            "spec.approvals.notify: set urlSecretRef (a Secret holding the URL; optionally "
            "urlEnv), or url alone for a URL without a token",
        ),
        _rule(
            "!has(self.slackSigningSecretRef) || (has(self.format) && self.format == 'slack')",
            "spec.approvals.notify.slackSigningSecretRef is for format slack",
            ".slackSigningSecretRef",
        ),
        _rule(
            "!has(self.format) || self.format != 'slack' || !has(self.recipients) "
            "|| size(self.recipients) == 0",
            "spec.approvals.notify.recipients is for format json: with format slack, whoever "
            "can press the message's buttons decides",
            ".recipients",
        ),
    )
    # Refused at admission, so a URL with a token is never stored in the object.
    token_free = " && ".join(
        f"!self.matches({_cel_string(pattern)})"
        for pattern in (URL_USERINFO, URL_QUERY, f"(?i){TOKEN_WEBHOOK}")
    )
    _add_rules(
        notify["properties"]["url"],
        _rule(token_free, f"spec.approvals.notify.url {URL_WITH_TOKEN}"),
    )
    _add_rules(
        props["observability"]["properties"]["otlpEndpoint"],
        _rule(
            credential_free,
            "spec.observability.otlpEndpoint carries user information or a query, stored in "
            "plain text: give the collector's address alone",
        ),
    )
    drain = props["drain"]
    _add_rules(
        drain,
        _rule(
            "duration(self.timeout) >= duration(self.delay)",
            "spec.drain.timeout must not be shorter than spec.drain.delay",
            ".timeout",
        ),
    )
    scaling = props["scaling"]
    _add_rules(
        scaling,
        _rule(
            "!has(self.minReplicas) || !has(self.maxReplicas) "
            "|| self.minReplicas <= self.maxReplicas",
            "spec.scaling.minReplicas must not be greater than spec.scaling.maxReplicas",
            ".minReplicas",
        ),
        _rule(
            "!has(self.activeRunsPerReplica) || has(self.maxReplicas)",
            "spec.scaling.activeRunsPerReplica needs spec.scaling.maxReplicas",
            ".activeRunsPerReplica",
        ),
    )

    _add_rules(
        props["limits"],
        _rule(
            "!has(self.onExhausted) || self.onExhausted != 'ask' || has(self.maxCostUsd) "
            "|| has(self.maxTokens)",
            "spec.limits.onExhausted: ask needs spec.limits.maxCostUsd or spec.limits.maxTokens",
            ".onExhausted",
        ),
    )

    caps = props["limits"]["properties"]["spendCaps"]
    _add_rules(
        caps,
        _rule(
            "self.all(c, self.filter(d, d.per == c.per && (has(d.model) ? d.model : '') == "
            "(has(c.model) ? c.model : '')).size() == 1)",
            "spec.limits.spendCaps: one cap per period (hour, day, month), and per model",
        ),
    )
    _add_rules(
        caps["items"],
        _rule(
            "has(self.maxCostUsd) || has(self.maxTokens)",
            "spec.limits.spendCaps[]: set maxCostUsd or maxTokens",
        ),
    )

    output = (
        "self.model.maxTokens + (has(self.behavior) && has(self.behavior.thinkingBudget) ? "
        "self.behavior.thinkingBudget : 0)"
    )
    _add_rules(
        spec,
        _rule(
            "!has(self.limits) || !has(self.limits.spendCaps) || size(self.limits.spendCaps) == 0"
            " || has(self.webhook)",
            "spec.limits.spendCaps needs spec.webhook: its key signs each call's hold",
            ".limits.spendCaps",
        ),
        _rule(
            "!has(self.limits) || !has(self.limits.spendCaps) || self.limits.spendCaps.all(c, "
            f"!has(c.maxTokens) || has(c.model) || c.maxTokens > {output})",
            "spec.limits.spendCaps[].maxTokens of a cap on every model must be larger than one "
            "model call's output (model.maxTokens plus behavior.thinkingBudget): each call holds "
            "it first",
            ".limits.spendCaps",
        ),
        _rule(
            f"!has(self.limits) || !has(self.limits.maxTokens) || self.limits.maxTokens > {output}",
            "spec.limits.maxTokens must be larger than one model call's output (model.maxTokens "
            "plus behavior.thinkingBudget): each call reserves it before it starts",
            ".limits.maxTokens",
        ),
        _rule(
            "!has(self.limits) || !has(self.limits.maxCostUsd) || !has(self.model.pricing) || "
            f"self.limits.maxCostUsd * 1000000.0 > double({output}) * "
            "self.model.pricing.outputPerMTok",
            "spec.limits.maxCostUsd must be more than one model call's output can cost "
            "(model.maxTokens plus behavior.thinkingBudget at model.pricing.outputPerMTok): each "
            "call reserves it before it starts",
            ".limits.maxCostUsd",
        ),
    )

    # Blocks with defaults of their own: an absent block gets them (validated like user input).
    defaults = DurableAgentSpec.model_fields
    for name in ("approvals", "limits", "behavior", "worker", "drain"):
        factory = defaults[name].default_factory
        assert factory is not None
        value = factory()  # type: ignore[call-arg]
        props[name]["default"] = value.model_dump(by_alias=True, exclude_none=True)
    return spec


def _status_schema() -> Schema:
    status = _openapi(DurableAgentStatus)
    props = status["properties"]
    props["conditions"]["x-kubernetes-list-type"] = "map"
    props["conditions"]["x-kubernetes-list-map-keys"] = ["type"]
    props["versions"]["x-kubernetes-list-type"] = "map"
    props["versions"]["x-kubernetes-list-map-keys"] = ["hash"]
    return status


def _root_schema() -> Schema:
    return {
        "type": "object",
        "description": "An AI agent whose runs survive crashes: each change of the spec is a "
        "new version of worker pods registered with Restate; old versions drain before they go.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "tether.dev/v1alpha1"},
            "kind": {"type": "string", "description": KIND},
            # Kubernetes allows no more than this for metadata (name rules are CEL below).
            "metadata": {"type": "object"},
            "spec": _spec_schema(),
            "status": _status_schema(),
        },
        "x-kubernetes-validations": [
            _rule(
                f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
                f"metadata.name must be at most {MAX_NAME_LENGTH} characters (the version hash "
                "is appended to it in Service names)",
            ),
            _rule(
                "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                "metadata.name must start with a letter and contain only lowercase letters, "
                "digits and '-' (it names Services and the Restate service)",
            ),
        ],
    }


PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": ".status.readyVersions",
        "description": "Registered versions with available pods, of all versions.",
    },
    {
        "name": "Parked",
        "type": "integer",
        "jsonPath": ".status.parkedCalls",
        "description": "Calls waiting for a person.",
    },
    {
        "name": "Budget",
        "type": "number",
        "jsonPath": ".spec.limits.maxCostUsd",
        "description": "USD a run may spend, its sub-agents included.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {
        "name": "Tokens",
        "type": "integer",
        "jsonPath": ".spec.limits.maxTokens",
        "priority": 1,
        "description": "Tokens a run may use, its sub-agents included.",
    },
    {
        "name": "Active",
        "type": "string",
        "jsonPath": ".status.activeVersion",
        "priority": 1,
        "description": "Hash of the version that takes new runs.",
    },
    {
        "name": "Model",
        "type": "string",
        "jsonPath": ".spec.model.name",
        "priority": 1,
    },
]


def durableagent_crd() -> dict[str, Any]:
    """The CustomResourceDefinition of `DurableAgent` as a manifest (a plain dict)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "tether"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": PLURAL,
                "singular": SINGULAR,
                "kind": KIND,
                "listKind": f"{KIND}List",
                "shortNames": SHORT_NAMES,
                "categories": ["tether"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": _root_schema()},
                }
            ],
        },
    }


def durableagent_crd_yaml() -> str:
    """`durableagent_crd()` as the YAML document checked in at `crds/durableagent.yaml`."""
    header = (
        "# Generated from tether.spec by `tether crd` (tether.spec.crd.durableagent_crd_yaml); "
        "do not edit.\n"
    )
    body = yaml.safe_dump(durableagent_crd(), sort_keys=False, width=100, allow_unicode=True)
    return header + body
