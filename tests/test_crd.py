"""The DurableAgent CRD: generated from tether.spec, checked in, enforced by a real API server."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client import ApiClient, ApiException

from tests.kube.conftest import kube_apiserver  # noqa: F401  (the shared tier-1 control plane)
from tests.kube.controlplane import ControlPlane
from tether.providers import Limited, LocalPacer, Pace, Rate
from tether.spec import SpecError, parse_agent
from tether.spec.assemble import (
    cooldown_from_spec,
    fallbacks_from_spec,
    provider_from_spec,
    subagents_from_spec,
)
from tether.spec.crd import (
    CRD_NAME,
    GROUP,
    PLURAL,
    VERSION,
    durableagent_crd,
    durableagent_crd_yaml,
)
from tether.testing import wait_until
from tether_operator.render import spec_document

CHECKED_IN = Path(__file__).resolve().parent.parent / "crds" / "durableagent.yaml"


def test_the_checked_in_crd_is_the_generated_one() -> None:
    assert CHECKED_IN.read_text() == durableagent_crd_yaml(), (
        "crds/durableagent.yaml is out of date: regenerate it with `tether crd > "
        "crds/durableagent.yaml`"
    )


def _properties(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, child in node.get("properties", {}).items():
        yield f"{path}.{name}", child
        yield from _properties(child, f"{path}.{name}")
    if "items" in node:
        yield from _properties(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _properties(node["additionalProperties"], f"{path}{{}}")


def test_the_schema_is_structural_and_every_field_is_described() -> None:
    schema = durableagent_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = json.dumps(schema)
    for keyword in ('"$ref"', '"title"', '"anyOf"', '"allOf"', '"$defs"', '"const"'):
        assert keyword not in text
    fields = list(_properties(schema, ""))
    assert len(fields) > 60
    undescribed = [
        path for path, node in fields if not node.get("description") and path != ".metadata"
    ]
    assert undescribed == []
    untyped = [
        path
        for path, node in fields
        if "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields")
    ]
    assert untyped == []


# -- the real API server ---------------------------------------------------------------------

APPLY = "application/apply-patch+yaml"


@pytest.fixture(scope="module")
def api(kube_apiserver: ControlPlane) -> Iterator[ApiClient]:  # noqa: F811
    api_client: ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube_apiserver.kubeconfig)
    )
    crds = client.ApiextensionsV1Api(api_client)
    crds.patch_custom_resource_definition(
        CRD_NAME, durableagent_crd(), field_manager="tether-tests", force=True, _content_type=APPLY
    )

    def established() -> bool:
        status = crds.read_custom_resource_definition(CRD_NAME).to_dict().get("status") or {}
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in status.get("conditions") or []
        )

    wait_until(established, timeout=30, what="the DurableAgent CRD to be Established")
    yield api_client
    api_client.close()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def namespace(api: ApiClient) -> str:
    name = f"crd-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace.model_validate({"metadata": {"name": name}})
    )
    return name


def agent(name: str = "triage", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DurableAgent",
        "metadata": {"name": name},
        "spec": {
            "model": {
                "provider": "anthropic",
                "name": "claude-sonnet-4-5",
                "apiKeySecretRef": {"name": "llm", "key": "api-key"},
            },
            **spec,
        },
    }


def create(api: ApiClient, namespace: str, body: dict[str, Any], dry_run: bool = True) -> Any:
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, dry_run="All" if dry_run else None
    )


def test_a_full_manifest_is_accepted_with_defaults_and_nulls_pruned(
    api: ApiClient, namespace: str
) -> None:
    body = agent(
        system="You triage the open alerts.",
        tools=[
            {"name": "fetch", "builtin": "http_request", "config": {"allowHosts": ["x.example"]}},
            {"name": "restart", "builtin": "shell", "requireApproval": True, "timeout": "30s"},
            {"name": "lookup", "python": "mypkg.tools:lookup", "replay": "safe"},
            {
                "name": "github",
                "timeout": "20s",
                "mcp": {
                    "url": "http://github-mcp.tools:8080/mcp",
                    "headers": [
                        {"name": "Authorization", "secretRef": {"name": "gh", "key": "token"}},
                        {"name": "X-Team", "value": "platform"},
                    ],
                    "include": ["get_*", "create_issue"],
                    "exclude": ["get_secret"],
                    "prefix": "gh_",
                    "tools": {"create_issue": {"requireApproval": True, "replay": "unsafe"}},
                },
            },
            {"name": "clock", "mcp": {"command": ["mcp-server-time"], "env": [{"name": "TZ"}]}},
        ],
        approvals={"timeout": "1h", "onTimeout": "deny", "notify": {"url": "https://h.example/x"}},
        subagents={"maxDepth": 2, "maxConcurrent": 3},
        limits={"maxTurns": 50, "maxCostUsd": 5, "maxTokens": 200000},
        behavior={"cache": True, "compactStrategy": "tail", "maxConcurrentTools": 4},
        worker={
            "image": None,
            "replicas": 1,
            "resources": {},
            "env": [{"name": "A", "value": "b"}],
        },
        webhook={"secretRef": {"name": "triage-webhook", "key": "secret"}},
        drain={"delay": "5m", "timeout": "24h"},
        scaling={"idleAfter": "10m", "minReplicas": 1, "maxReplicas": 4},
        observability={"otlpEndpoint": "http://otel-collector.observability:4318"},
    )
    body["spec"]["model"]["baseUrl"] = None
    created = create(api, namespace, body, dry_run=False)
    spec = created["spec"]
    assert "baseUrl" not in spec["model"] and "image" not in spec["worker"]
    assert spec["model"]["maxTokens"] == 4096
    assert spec["tools"][0]["requireApproval"] is False
    assert spec["worker"]["env"] == [{"name": "A", "value": "b"}]
    assert spec["tools"][3]["mcp"]["transport"] == "streamable-http"
    assert spec["tools"][4]["mcp"]["env"] == [{"name": "TZ"}]
    assert spec["observability"] == {"otlpEndpoint": "http://otel-collector.observability:4318"}
    assert spec["scaling"] == {
        "idleAfter": "10m",
        "minReplicas": 1,
        "maxReplicas": 4,
        "scaleDownAfter": "5m",
    }

    minimal = create(api, namespace, agent("minimal"), dry_run=False)["spec"]
    assert minimal["approvals"] == {"timeout": "1h", "onTimeout": "deny"}
    assert minimal["drain"] == {"delay": "5m", "timeout": "24h"}
    assert "scaling" not in minimal  # unset: versions keep their replicas
    assert minimal["limits"] == {"maxTurns": 50}
    assert minimal["worker"] == {
        "replicas": 1,
        "resources": {"requests": {}, "limits": {}},
        "env": [],
    }
    assert minimal["behavior"] == {"cache": False, "maxConcurrentTools": 1}

    scripted = agent("scripted")
    scripted["spec"]["model"] = {"provider": "scripted", "name": "s", "script": [{"text": "hi"}]}
    create(api, namespace, scripted)
    keyed = agent("keyed-script")  # responses by the conversation's first message
    keyed["spec"]["model"] = {
        "provider": "scripted",
        "name": "s",
        "script": [
            {"prompt": "task", "responses": [{"text": "done"}]},
            {"prompt": "*", "responses": [{"text": "hi"}]},
        ],
    }
    create(api, namespace, keyed)


def _model(**model: Any) -> dict[str, Any]:
    return {"model": {"provider": "anthropic", "name": "c", **model}}


KEY = {"apiKeySecretRef": {"name": "llm", "key": "k"}}

PRICED = {"pricing": {"inputPerMTok": 3, "outputPerMTok": 15}, **KEY}
BUDGETS_NO_CALL_FITS: list[tuple[str, dict[str, Any], str]] = [
    (
        "token-budget-below-one-output",
        {**_model(**KEY), "limits": {"maxTokens": 4096}},
        "spec.limits.maxTokens",
    ),
    (
        "token-budget-below-output-and-thinking",
        {
            **_model(maxTokens=1000, **KEY),
            "limits": {"maxTokens": 3000},
            "behavior": {"thinkingBudget": 2000},
        },
        "spec.limits.maxTokens",
    ),
    (
        # 4,096 output tokens at $15 per million may cost $0.06144.
        "cost-budget-below-one-output",
        {**_model(**PRICED), "limits": {"maxCostUsd": 0.06}},
        "spec.limits.maxCostUsd",
    ),
]
SIGNED = {"webhook": {"secretRef": {"name": "hook", "key": "key"}}}


def _capped(*caps: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {**_model(**KEY), **SIGNED, "limits": {"spendCaps": list(caps)}, **spec}


DAILY = {"per": "day", "maxTokens": 100_000}
SPEND_CAPS_THAT_CANNOT_WORK: list[tuple[str, dict[str, Any], str]] = [
    ("spend-cap-without-a-limit", _capped({"per": "day"}), "spec.limits.spendCaps[0]"),
    ("spend-cap-of-no-period", _capped({**DAILY, "per": "week"}), "spec.limits.spendCaps[0].per"),
    ("spend-caps-of-one-period", _capped(DAILY, DAILY), "spec.limits.spendCaps"),
    ("spend-caps-unsigned", _capped(DAILY, webhook=None), "spec.limits.spendCaps needs"),
    (
        "spend-caps-of-one-period-and-model",
        _capped(DAILY, {**DAILY, "model": "c"}, {**DAILY, "model": "c"}),
        "spec.limits.spendCaps: one cap per period (hour, day, month), and per model",
    ),
    (
        "spend-cap-model-too-long",
        _capped({**DAILY, "model": "c" * 129}),
        "spec.limits.spendCaps[0].model",
    ),
    (
        "spend-cap-below-one-output",
        _capped({"per": "hour", "maxTokens": 4096}),
        "spec.limits.spendCaps[].maxTokens",
    ),
]
INVALID: list[tuple[str, dict[str, Any], str]] = [
    *BUDGETS_NO_CALL_FITS,
    *SPEND_CAPS_THAT_CANNOT_WORK,
    ("no-model", {"model": None}, "spec.model: Required value"),
    ("bad-provider", _model(provider="gemini", **KEY), "spec.model.provider"),
    ("empty-model-name", _model(name="", **KEY), "spec.model.name"),
    ("zero-max-tokens", _model(maxTokens=0, **KEY), "spec.model.maxTokens"),
    ("anthropic-without-key", _model(), "spec.model.apiKeySecretRef"),
    (
        "openai-without-key",
        {"model": {"provider": "openai", "name": "gpt"}},
        "spec.model.apiKeySecretRef",
    ),
    (
        "key-ref-without-key",
        _model(apiKeySecretRef={"name": "llm"}),
        "spec.model.apiKeySecretRef.key",
    ),
    (
        "scripted-without-script",
        {"model": {"provider": "scripted", "name": "s"}},
        "spec.model.script",
    ),
    ("script-for-anthropic", _model(script=[{"text": "x"}], **KEY), "spec.model.script"),
    (
        "negative-price",
        _model(pricing={"inputPerMTok": -1, "outputPerMTok": 1}, **KEY),
        "spec.model.pricing.inputPerMTok",
    ),
    (
        "duplicate-tools",
        {
            **_model(**KEY),
            "tools": [{"name": "a", "builtin": "read_file"}, {"name": "a", "builtin": "shell"}],
        },
        "spec.tools",
    ),
    (
        "tool-without-source",
        {**_model(**KEY), "tools": [{"name": "a"}]},
        "spec.tools[0]",
    ),
    (
        "tool-with-two-sources",
        {**_model(**KEY), "tools": [{"name": "a", "builtin": "shell", "python": "m:f"}]},
        "spec.tools[0]",
    ),
    (
        "unknown-builtin",
        {**_model(**KEY), "tools": [{"name": "a", "builtin": "shell2"}]},
        "spec.tools[0].builtin",
    ),
    (
        "bad-tool-name",
        {**_model(**KEY), "tools": [{"name": "a b", "builtin": "shell"}]},
        "spec.tools[0].name",
    ),
    (
        "bad-import-path",
        {**_model(**KEY), "tools": [{"name": "a", "python": "not a path"}]},
        "spec.tools[0].python",
    ),
    (
        "zero-tool-timeout",
        {**_model(**KEY), "tools": [{"name": "a", "builtin": "shell", "timeout": "0s"}]},
        "spec.tools[0].timeout",
    ),
    (
        "mcp-with-python",
        {**_model(**KEY), "tools": [{"name": "a", "python": "m:f", "mcp": {"url": "http://m"}}]},
        "spec.tools[0]",
    ),
    (
        "mcp-url-and-command",
        {**_model(**KEY), "tools": [{"name": "a", "mcp": {"url": "http://m", "command": ["x"]}}]},
        "spec.tools[0].mcp",
    ),
    (
        "mcp-url-with-a-sandbox",
        {**_model(**KEY), "tools": [{"name": "a", "mcp": {"url": "http://m", "sandbox": {}}}]},
        "spec.tools[0].mcp",
    ),
    (
        "mcp-url-with-a-token",
        {**_model(**KEY), "tools": [{"name": "a", "mcp": {"url": "http://m/mcp?key=k"}}]},
        "spec.tools[0].mcp.url",
    ),
    (
        "mcp-credential-in-plain-text",
        {
            **_model(**KEY),
            "tools": [
                {
                    "name": "a",
                    "mcp": {"url": "http://m", "headers": [{"name": "X-Api-Key", "value": "k"}]},
                }
            ],
        },
        "spec.tools[0].mcp.headers[0]",
    ),
    (
        "mcp-env-credential-in-plain-text",
        {
            **_model(**KEY),
            "tools": [
                {
                    "name": "a",
                    "mcp": {"command": ["x"], "env": [{"name": "GITHUB_TOKEN", "value": "ghp_1"}]},
                }
            ],
        },
        "spec.tools[0].mcp.env[0]",
    ),
    (
        "mcp-sandbox-relative-path",
        {
            **_model(**KEY),
            "tools": [{"name": "a", "mcp": {"command": ["x"], "sandbox": {"readPaths": ["data"]}}}],
        },
        "spec.tools[0].mcp.sandbox.readPaths[0]",
    ),
    (
        "mcp-sandbox-required-but-off",
        {
            **_model(**KEY),
            "tools": [
                {
                    "name": "a",
                    "mcp": {"command": ["x"], "sandbox": {"enabled": False, "required": True}},
                }
            ],
        },
        "spec.tools[0].mcp.sandbox",
    ),
    (
        "mcp-env-the-workers-secret",
        {
            **_model(**KEY),
            "tools": [
                {
                    "name": "a",
                    "mcp": {
                        "command": ["x"],
                        "env": [{"name": "T", "env": "TETHER_WEBHOOK_SECRET"}],
                    },
                }
            ],
        },
        "spec.tools[0].mcp.env[0].env",
    ),
    (
        "mcp-env-value-and-secret",
        {
            **_model(**KEY),
            "tools": [
                {
                    "name": "a",
                    "mcp": {
                        "command": ["x"],
                        "env": [
                            {"name": "X", "value": "v", "secretRef": {"name": "s", "key": "k"}}
                        ],
                    },
                }
            ],
        },
        "spec.tools[0].mcp.env[0]",
    ),
    (
        "mcp-header-without-value",
        {
            **_model(**KEY),
            "tools": [{"name": "a", "mcp": {"url": "http://m", "headers": [{"name": "X"}]}}],
        },
        "spec.tools[0].mcp.headers[0]",
    ),
    (
        "mcp-description",
        {**_model(**KEY), "tools": [{"name": "a", "description": "d", "mcp": {"url": "http://m"}}]},
        "spec.tools[0]",
    ),
    ("zero-max-turns", {**_model(**KEY), "limits": {"maxTurns": 0}}, "spec.limits.maxTurns"),
    ("negative-budget", {**_model(**KEY), "limits": {"maxCostUsd": -1}}, "spec.limits.maxCostUsd"),
    ("zero-token-budget", {**_model(**KEY), "limits": {"maxTokens": 0}}, "spec.limits.maxTokens"),
    (
        "bad-compact-strategy",
        {**_model(**KEY), "behavior": {"compactStrategy": "head"}},
        "spec.behavior.compactStrategy",
    ),
    ("bad-duration", {**_model(**KEY), "drain": {"delay": "5 minutes"}}, "spec.drain.delay"),
    (
        "drain-timeout-below-delay",
        {**_model(**KEY), "drain": {"delay": "10m", "timeout": "1m"}},
        "spec.drain.timeout",
    ),
    (
        "zero-approval-timeout",
        {**_model(**KEY), "approvals": {"timeout": "0s"}},
        "spec.approvals.timeout",
    ),
    (
        "bad-notify-url",
        {**_model(**KEY), "approvals": {"notify": {"url": "ftp://x"}}},
        "spec.approvals.notify.url",
    ),
    (
        "notify-url-and-secret",
        {
            **_model(**KEY),
            "approvals": {
                "notify": {"url": "https://h.example/x", "urlSecretRef": {"name": "n", "key": "k"}}
            },
        },
        "spec.approvals.notify",
    ),
    ("notify-without-url", {**_model(**KEY), "approvals": {"notify": {}}}, "spec.approvals.notify"),
    (
        "notify-url-with-a-token",
        {**_model(**KEY), "approvals": {"notify": {"url": "https://h.example/x?token=t0ken"}}},
        "spec.approvals.notify.url",
    ),
    (
        "slack-signing-secret-for-json",
        {
            **_model(**KEY),
            "approvals": {
                "notify": {
                    "urlSecretRef": {"name": "n", "key": "k"},
                    "slackSigningSecretRef": {"name": "s", "key": "k"},
                }
            },
        },
        "spec.approvals.notify.slackSigningSecretRef",
    ),
    (
        "slack-with-recipients",
        {
            **_model(**KEY),
            "approvals": {
                "notify": {
                    "format": "slack",
                    "urlSecretRef": {"name": "n", "key": "k"},
                    "recipients": ["alice@example.com"],
                }
            },
        },
        "spec.approvals.notify.recipients",
    ),
    (
        "unknown-notify-format",
        {
            **_model(**KEY),
            "approvals": {"notify": {"format": "teams", "urlSecretRef": {"name": "n", "key": "k"}}},
        },
        "spec.approvals.notify.format",
    ),
    ("too-many-replicas", {**_model(**KEY), "worker": {"replicas": 101}}, "spec.worker.replicas"),
    (
        "bad-env-name",
        {**_model(**KEY), "worker": {"env": [{"name": "1X", "value": "v"}]}},
        "spec.worker.env[0].name",
    ),
    ("webhook-without-ref", {**_model(**KEY), "webhook": {}}, "spec.webhook.secretRef"),
    (
        "subagents-too-deep",
        {**_model(**KEY), "subagents": {"maxDepth": 9}},
        "spec.subagents.maxDepth",
    ),
    (
        "otlp-endpoint-not-http",
        {**_model(**KEY), "observability": {"otlpEndpoint": "grpc://collector:4317"}},
        "spec.observability.otlpEndpoint",
    ),
    (
        "otlp-endpoint-with-a-token",
        {**_model(**KEY), "observability": {"otlpEndpoint": "http://c:4318?api-key=t0ken"}},
        "spec.observability.otlpEndpoint",
    ),
    ("events-retain-too-few", {**_model(**KEY), "events": {"retain": 99}}, "spec.events.retain"),
    (
        "events-retain-too-many",
        {**_model(**KEY), "events": {"retain": 1_000_001}},
        "spec.events.retain",
    ),
    (
        "no-live-batches",
        {**_model(**KEY), "events": {"liveBatches": 0}},
        "spec.events.liveBatches",
    ),
    (
        "zero-stop-grace-period",
        {**_model(**KEY), "worker": {"stopGracePeriod": "0s"}},
        "spec.worker.stopGracePeriod",
    ),
    (
        "zero-idle-after",
        {**_model(**KEY), "scaling": {"idleAfter": "0s"}},
        "spec.scaling.idleAfter",
    ),
    (
        "bad-idle-after",
        {**_model(**KEY), "scaling": {"idleAfter": "soon"}},
        "spec.scaling.idleAfter",
    ),
    (
        "min-replicas-above-max",
        {**_model(**KEY), "scaling": {"minReplicas": 3, "maxReplicas": 2}},
        "spec.scaling.minReplicas",
    ),
    (
        "zero-min-replicas",
        {**_model(**KEY), "scaling": {"minReplicas": 0}},
        "spec.scaling.minReplicas",
    ),
    (
        "autoscaled-without-max-replicas",
        {**_model(**KEY), "scaling": {"activeRunsPerReplica": 10}},
        "spec.scaling.activeRunsPerReplica",
    ),
    (
        "zero-active-runs-per-replica",
        {**_model(**KEY), "scaling": {"activeRunsPerReplica": 0, "maxReplicas": 2}},
        "spec.scaling.activeRunsPerReplica",
    ),
    (
        "ask-for-a-budget-that-is-not-set",
        {**_model(**KEY), "limits": {"onExhausted": "ask", "maxTurns": 5}},
        "spec.limits.onExhausted",
    ),
    (
        "too-many-max-replicas",
        {**_model(**KEY), "scaling": {"maxReplicas": 101}},
        "spec.scaling.maxReplicas",
    ),
]


@pytest.mark.parametrize(("name", "spec", "field"), INVALID, ids=[case[0] for case in INVALID])
def test_an_invalid_manifest_is_rejected_naming_the_field(
    api: ApiClient, namespace: str, name: str, spec: dict[str, Any], field: str
) -> None:
    body = agent(name)
    body["spec"] = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(ApiException) as rejected:
        create(api, namespace, body)
    assert rejected.value.status == 422, rejected.value.body
    message = json.loads(rejected.value.body or "{}")["message"]
    assert field in message, message


SLACK_TOKEN = "xT0kenT0kenT0kenT0kenT0ke"


@pytest.mark.parametrize(
    "url",
    [
        f"https://hooks.slack.com/services/T0AAAAAAA/B0BBBBBBB/{SLACK_TOKEN}",
        f"https://HOOKS.SLACK.COM/services/T0AAAAAAA/B0BBBBBBB/{SLACK_TOKEN}",
        f"https://discord.com/api/webhooks/123456/{SLACK_TOKEN}",
        f"https://acme.webhook.office.com/webhookb2/{SLACK_TOKEN}",
        f"https://hooks.example.com/notify?token={SLACK_TOKEN}",
        f"https://bot:{SLACK_TOKEN}@hooks.example.com/notify",
    ],
)
def test_a_notify_url_with_a_token_is_refused_and_never_stored(
    api: ApiClient, namespace: str, url: str
) -> None:
    """Refused at admission (CEL), so it never reaches etcd (the API server's answer to the one
    who sent it quotes the value, as it does for any invalid field). The spec model refuses it
    too (`tether dev`, the worker, the operator), naming the Secret form, without quoting it."""
    body = agent(f"noisy-{uuid.uuid4().hex[:6]}", approvals={"notify": {"url": url}})
    with pytest.raises(ApiException) as rejected:
        create(api, namespace, body, dry_run=False)
    assert rejected.value.status == 422, rejected.value.body
    message = json.loads(rejected.value.body or "{}")["message"]
    assert "spec.approvals.notify.url" in message and "urlSecretRef" in message, message
    objects = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL
    )
    assert SLACK_TOKEN not in json.dumps(objects)
    with pytest.raises(SpecError) as refused:
        parse_agent(body)
    assert "spec.approvals.notify.url" in str(refused.value) and "urlSecretRef" in str(
        refused.value
    )
    assert SLACK_TOKEN not in str(refused.value)


@pytest.mark.parametrize(
    ("name", "spec", "field"), BUDGETS_NO_CALL_FITS, ids=[c[0] for c in BUDGETS_NO_CALL_FITS]
)
def test_the_spec_refuses_a_budget_no_call_fits_like_the_api_server(
    name: str, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse_agent(agent(name, **spec))
    assert field.removeprefix("spec.") in str(refused.value)
    # One token or one cent more and a call fits.
    roomy = json.loads(json.dumps(spec))
    limits = roomy["limits"]
    if "maxTokens" in limits:
        limits["maxTokens"] += 1
    else:
        limits["maxCostUsd"] = 0.0615
    parse_agent(agent(name, **roomy))


def test_a_stdio_servers_sandbox_is_defaulted_and_kept(api: ApiClient, namespace: str) -> None:
    sandbox = {"anyPort": True, "writePaths": ["/data"]}
    tools = [
        {"name": "open", "mcp": {"command": ["mcp-server-fetch"], "sandbox": sandbox}},
        {"name": "clock", "mcp": {"command": ["mcp-server-time"]}},
    ]
    created = create(api, namespace, agent("sandboxed", tools=tools), dry_run=False)
    assert created["spec"]["tools"][0]["mcp"]["sandbox"] == {
        **sandbox,
        "enabled": True,
        "unixSockets": False,
        "required": False,
    }
    parsed = parse_agent(created).spec.tools
    assert parsed[0].mcp is not None and parsed[0].mcp.sandbox.policy().connect_ports is None
    assert parsed[1].mcp is not None and parsed[1].mcp.sandbox.connect_ports == [53, 80, 443]
    assert parsed[1].mcp.sandbox.enabled


def test_the_workers_copy_of_a_spec_reads_back_as_the_same_spec() -> None:
    """The operator writes the normalised spec, defaults included, into the version's
    ConfigMap (`spec_document`); the worker must read it back as the same spec (a `sandbox`
    written out for a `url` server made every worker refuse its spec)."""
    secret = {"name": "API_TOKEN", "secretRef": {"name": "s", "key": "k"}}
    tools = [
        {"name": "remote", "mcp": {"url": "http://github-mcp.tools:8080/mcp"}},
        {
            "name": "local",
            "mcp": {
                "command": ["mcp-server-fetch"],
                "env": [secret, {"name": "TZ"}],
                "sandbox": {"anyPort": True, "writePaths": ["/data"]},
            },
        },
        {"name": "sh", "builtin": "shell", "config": {"sandbox": {"connectPorts": None}}},
    ]
    agent_ = parse_agent(agent("copied", tools=tools))
    copy = parse_agent(yaml.safe_load(spec_document(agent_, "agents")))
    assert copy.spec == agent_.spec


def test_a_notify_url_from_a_secret_is_accepted(api: ApiClient, namespace: str) -> None:
    notify = {"urlSecretRef": {"name": "slack", "key": "url"}, "urlEnv": "SLACK_URL"}
    created = create(api, namespace, agent("notified", approvals={"notify": notify}))
    assert created["spec"]["approvals"]["notify"] == notify
    plain = {"url": "http://approver.ops.svc.cluster.local/hook"}  # no token: may stay plain
    create(api, namespace, agent("plain", approvals={"notify": plain}))


@pytest.mark.parametrize(
    ("name", "why"),
    [("Triage", "lowercase"), ("1triage", "start with a letter"), ("a" * 53, "at most 52")],
)
def test_an_invalid_name_is_rejected(api: ApiClient, namespace: str, name: str, why: str) -> None:
    with pytest.raises(ApiException) as rejected:
        create(api, namespace, agent(name))
    assert rejected.value.status == 422
    assert why in json.loads(rejected.value.body or "{}")["message"]


def test_the_cases_are_at_least_fifteen_distinct_fields() -> None:
    assert len({field for _, _, field in INVALID}) >= 15


def test_status_is_a_subresource_with_a_real_schema(api: ApiClient, namespace: str) -> None:
    objects = client.CustomObjectsApi(api)
    create(api, namespace, agent("with-status"), dry_run=False)
    status = {
        "phase": "Ready",
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "VersionActive",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "versions": [{"hash": "abc", "state": "Active", "restateDeploymentId": "dp_1"}],
        "readyVersions": "1/1",
        "parkedCalls": 2,
        "unknownField": "pruned",
    }
    objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "with-status", {"status": status}
    )
    read: Any = objects.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "with-status"
    )
    assert read["status"]["versions"] == [
        {"hash": "abc", "state": "Active", "restateDeploymentId": "dp_1", "inFlight": 0}
    ]
    assert "unknownField" not in read["status"]
    # A status write does not bump the generation: the spec did not change.
    assert read["metadata"]["generation"] == 1

    bad = copy.deepcopy(status)
    bad["phase"] = "Dancing"
    with pytest.raises(ApiException) as rejected:
        objects.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "with-status", {"status": bad}
        )
    assert "status.phase" in json.loads(rejected.value.body or "{}")["message"]


def test_kubectl_shows_printer_columns_and_explains_fields(
    kube_apiserver: ControlPlane,  # noqa: F811
    api: ApiClient,
    namespace: str,
) -> None:
    budgeted = agent("listed")
    budgeted["spec"]["limits"] = {"maxCostUsd": 2.5, "maxTokens": 400000}
    create(api, namespace, budgeted, dry_run=False)
    table = kube_apiserver.kubectl("get", "da", "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "PHASE", "READY", "PARKED", "BUDGET", "AGE"]
    assert table[1].split()[-2] == "2.5"
    wide = kube_apiserver.kubectl("get", "da", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[:7] == ["NAME", "PHASE", "READY", "PARKED", "BUDGET", "AGE", "TOKENS"]
    assert "400000" in wide[1].split()

    explained = kube_apiserver.kubectl("explain", "durableagents.spec.model").stdout
    assert "Which model answers, and how to reach it." in explained
    assert "apiKeySecretRef" in explained and "Secret holding the API key" in explained
    assert "anthropic, openai (any OpenAI-compatible server) or scripted." in explained
    drain = kube_apiserver.kubectl("explain", "durableagents.spec.drain.timeout").stdout
    assert "Remove the version after this long even with runs pinned: they are" in drain


FALLBACK = {
    "provider": "openai",
    "name": "gpt-4o",
    "apiKeySecretRef": {"name": "llm-2", "key": "k"},
}


def test_fallback_models_are_accepted_with_their_defaults_and_bounded(
    api: ApiClient, namespace: str
) -> None:
    created = create(api, namespace, agent("fallen", **_model(**KEY, fallbacks=[FALLBACK])))
    [fallback] = created["spec"]["model"]["fallbacks"]
    assert fallback["maxTokens"] == 4096  # each model's own output tokens
    assert parse_agent(created).spec.model.choices()[1][1].name == "gpt-4o"
    too_many = agent("many", **_model(**KEY, fallbacks=[FALLBACK] * 5))
    with pytest.raises(ApiException) as rejected:
        create(api, namespace, too_many)
    assert rejected.value.status == 422
    assert "spec.model.fallbacks" in json.loads(rejected.value.body or "{}")["message"]
    with pytest.raises(SpecError, match="fallbacks"):
        parse_agent(too_many)


def test_a_cooldown_is_defaulted_by_the_api_server_and_its_bounds_are_kept(
    api: ApiClient, namespace: str
) -> None:
    cooled = _model(**KEY, fallbacks=[FALLBACK], cooldown={})
    created = create(api, namespace, agent("cooled", **cooled))
    assert created["spec"]["model"]["cooldown"] == {"failures": 3, "duration": "30s"}
    for cooldown, field in (({"failures": 0}, "failures"), ({"duration": "soon"}, "duration")):
        rejected_agent = agent("cold", **_model(**KEY, fallbacks=[FALLBACK], cooldown=cooldown))
        with pytest.raises(ApiException) as rejected:
            create(api, namespace, rejected_agent)
        assert rejected.value.status == 422
        assert f"spec.model.cooldown.{field}" in json.loads(rejected.value.body or "{}")["message"]
        with pytest.raises(SpecError, match=field):
            parse_agent(rejected_agent)


def test_a_models_cap_on_calls_in_flight_is_bounded_and_wraps_its_provider(
    api: ApiClient, namespace: str
) -> None:
    capped = {**FALLBACK, "maxConcurrentCalls": 8}
    created = create(api, namespace, agent("capped", **_model(**KEY, fallbacks=[capped])))
    assert created["spec"]["model"]["fallbacks"][0]["maxConcurrentCalls"] == 8
    with pytest.raises(ApiException) as rejected:
        create(api, namespace, agent("uncapped", **_model(**KEY, maxConcurrentCalls=0)))
    assert "spec.model.maxConcurrentCalls" in json.loads(rejected.value.body or "{}")["message"]
    spec = parse_agent(agent("capped", **_model(**KEY, fallbacks=[capped]))).spec
    [fallback] = fallbacks_from_spec(spec, {"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o"})
    assert isinstance(fallback.provider, Limited) and fallback.provider.max_calls == 8
    assert not isinstance(provider_from_spec(spec, "a"), Limited)


def test_a_models_rate_limit_is_bounded_and_paces_its_provider(
    api: ApiClient, namespace: str
) -> None:
    paced = _model(**KEY, rateLimit={"requestsPerMinute": 50})
    created = create(api, namespace, agent("paced", **paced))
    assert created["spec"]["model"]["rateLimit"] == {"requestsPerMinute": 50}
    for limit, field in (
        ({"requestsPerMinute": 0}, "requestsPerMinute"),
        ({"inputTokensPerMinute": 0}, "inputTokensPerMinute"),
    ):
        unpaced = agent("unpaced", **_model(**KEY, rateLimit=limit))
        with pytest.raises(ApiException) as rejected:
            create(api, namespace, unpaced)
        assert f"spec.model.rateLimit.{field}" in json.loads(rejected.value.body or "{}")["message"]
        with pytest.raises(SpecError, match=field):
            parse_agent(unpaced)
    only_burst = {"burst": 5, "inputTokensPerMinute": 100}
    for limit, says in (({}, "give requestsPerMinute"), (only_burst, "burst is of")):
        with pytest.raises(SpecError, match=says):
            parse_agent(agent("unpaced", **_model(**KEY, rateLimit=limit)))
    provider = provider_from_spec(parse_agent(created).spec, "a")
    assert isinstance(provider, Limited) and provider.max_calls is None
    assert isinstance(provider.pacer, LocalPacer) and provider.pacer.pace == Pace(Rate(50))
    tokens = _model(**KEY, rateLimit={"inputTokensPerMinute": 30_000})
    paced = provider_from_spec(
        parse_agent(create(api, namespace, agent("tokens", **tokens))).spec, "a"
    )
    assert isinstance(paced, Limited) and isinstance(paced.pacer, LocalPacer)
    assert paced.pacer.pace == Pace(input_tokens=Rate(30_000))


def test_the_workers_cooldown_comes_from_the_spec_and_is_there_only_with_fallbacks() -> None:
    cooled = _model(**KEY, fallbacks=[FALLBACK], cooldown={"failures": 5, "duration": "2m"})
    cooldown = cooldown_from_spec(parse_agent(agent("a", **cooled)).spec)
    assert cooldown is not None and (cooldown.failures, cooldown.seconds) == (5, 120)
    defaulted = cooldown_from_spec(
        parse_agent(agent("a", **_model(**KEY, fallbacks=[FALLBACK]))).spec
    )
    assert defaulted is not None and (defaulted.failures, defaulted.seconds) == (3, 30)
    assert cooldown_from_spec(parse_agent(agent("a", **_model(**KEY))).spec) is None


OUTPUT_SCHEMA = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
    "$defs": {"tag": {"type": "string", "pattern": "^[a-z]+$"}},
    "required": ["tags"],
}


def test_an_output_schema_is_kept_whole_by_the_api_server_and_checked_by_the_spec(
    api: ApiClient, namespace: str
) -> None:
    created = create(
        api, namespace, agent("shaped", **_model(**KEY), output={"schema": OUTPUT_SCHEMA})
    )
    assert created["spec"]["output"] == {"schema": OUTPUT_SCHEMA, "retries": 2}
    assert parse_agent(created).spec.output is not None
    with pytest.raises(ApiException) as rejected:
        create(api, namespace, agent("unshaped", **_model(**KEY), output={"retries": 1}))
    assert rejected.value.status == 422
    assert "spec.output.schema" in json.loads(rejected.value.body or "{}")["message"]
    with pytest.raises(SpecError, match=r"spec\.output\.schema: not a JSON Schema"):
        parse_agent(agent("bad", **_model(**KEY), output={"schema": {"type": 3}}))
    clash = [{"name": "final_answer", "builtin": "read_file"}]
    with pytest.raises(SpecError, match="a tool is named final_answer"):
        parse_agent(agent("clash", **_model(**KEY), output={"schema": OUTPUT_SCHEMA}, tools=clash))


def _other_key(**model: Any) -> dict[str, Any]:
    return {"provider": "anthropic", "name": "h", **model}


SHELL_WITH = [{"name": "sh", "builtin": "shell", "config": {"passEnv": ["PATHS", "LLM_KEY"]}}]


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (  # two Secrets in one variable: the worker would see only one of them
            _model(**KEY, fallbacks=[_other_key(apiKeySecretRef={"name": "b", "key": "k"})]),
            "spec.model.fallbacks[0] reads its API key from ANTHROPIC_API_KEY, which spec.model",
        ),
        (  # a fallback's output at its price passes the budget: none of its calls could start
            {
                **_model(
                    **PRICED,
                    fallbacks=[{**FALLBACK, "pricing": {"inputPerMTok": 1, "outputPerMTok": 150}}],
                ),
                "limits": {"maxCostUsd": 0.5},
            },
            "one call of model.fallbacks[0]",
        ),
        (  # a model's key handed to the agent's shell by its own name
            {
                **_model(**KEY, fallbacks=[{**FALLBACK, "apiKeyEnv": "LLM_KEY"}]),
                "tools": SHELL_WITH,
            },
            "spec.tools[0].config.passEnv: LLM_KEY holds a secret",
        ),
        (_model(**KEY, fallbacks=[{"provider": "scripted", "name": "s"}]), "needs `script`"),
        (_model(**KEY, cooldown={"failures": 1}), "cooldown skips a model for the next of"),
    ],
    ids=[
        "one-variable-two-secrets",
        "budget-below-a-fallback-call",
        "key-to-shell",
        "no-script",
        "cooldown-without-fallbacks",
    ],
)
def test_the_spec_refuses_fallbacks_that_cannot_work(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_agent(agent("fallen", **spec))
    assert says in str(refused.value)


def test_two_models_of_one_provider_read_their_keys_from_variables_of_their_own() -> None:
    other = _other_key(apiKeySecretRef={"name": "b", "key": "k"}, apiKeyEnv="HAIKU_KEY")
    spec = parse_agent(agent("fallen", **_model(**KEY, fallbacks=[other]))).spec
    assert spec.secret_variables() == ["ANTHROPIC_API_KEY", "HAIKU_KEY"]


REVIEWER = {
    "name": "reviewer",
    "description": "Reviews a change.",
    "tools": ["read"],
    "model": "gpt-4o",
    "output": {"schema": {"type": "object"}},
    "maxTurns": 5,
}


def test_named_sub_agents_are_kept_by_the_api_server_and_built_on_the_agents_models(
    api: ApiClient, namespace: str
) -> None:
    spec = {
        **_model(**KEY, maxTokens=1000, fallbacks=[{**FALLBACK, "maxTokens": 300}]),
        "tools": [{"name": "read", "builtin": "read_file"}],
        "subagents": {"agents": [REVIEWER]},
    }
    created = create(api, namespace, agent("team", **spec))
    assert created["spec"]["subagents"]["agents"] == [
        {**REVIEWER, "output": {"schema": {"type": "object"}, "retries": 2}}
    ]
    for bad, field in (({"name": "Bad_Name"}, "name"), ({"description": ""}, "description")):
        with pytest.raises(ApiException) as rejected:
            spec_ = {**spec, "subagents": {"agents": [{**REVIEWER, **bad}]}}
            create(api, namespace, agent("bad", **spec_))
        assert (
            f"spec.subagents.agents[0].{field}"
            in json.loads(rejected.value.body or "{}")["message"]
        )
    parsed = parse_agent(created).spec
    keys = {"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o"}
    first, fallbacks = provider_from_spec(parsed, "a"), fallbacks_from_spec(parsed, keys)
    [reviewer] = subagents_from_spec(parsed, first, fallbacks)
    # Its model first (with its own output tokens), then the agent's main one.
    assert reviewer.provider is fallbacks[0].provider
    assert [(f.provider, f.max_output_tokens) for f in reviewer.fallbacks] == [(first, 1000)]
    assert reviewer.behavior == {"max_turns": 5, "max_output_tokens": 300}
    assert reviewer.tools == ("read",) and reviewer.output is not None


@pytest.mark.parametrize(
    ("changed", "says"),
    [
        ({"tools": ["write"]}, "spec.subagents.agents[0].tools: write is not among spec.tools"),
        ({"model": "gpt-5"}, "'gpt-5' is not one of the agent's models (anthropic/c)"),
    ],
    ids=["unknown-tool", "unknown-model"],
)
def test_the_spec_refuses_a_sub_agent_naming_what_the_agent_does_not_have(
    changed: dict[str, Any], says: str
) -> None:
    spec = {
        **_model(**KEY),
        "tools": [{"name": "read", "builtin": "read_file"}],
        "subagents": {"agents": [{**REVIEWER, "model": "c", **changed}]},
    }
    with pytest.raises(SpecError) as refused:
        parse_agent(agent("team", **spec))
    assert says in str(refused.value)


def test_the_spec_refuses_two_sub_agents_of_one_name_and_a_tool_their_output_needs() -> None:
    read = [{"name": "read", "builtin": "read_file"}]
    twice = {"agents": [{**REVIEWER, "model": "c"}] * 2}
    with pytest.raises(SpecError, match=r"agents\[1\]\.name: 'reviewer' is the name of another"):
        parse_agent(agent("team", **_model(**KEY), tools=read, subagents=twice))
    clash = [*read, {"name": "final_answer", "builtin": "read_file"}]
    once = {"agents": [{**REVIEWER, "model": "c"}]}
    with pytest.raises(SpecError, match="a tool is named final_answer"):
        parse_agent(agent("team", **_model(**KEY), tools=clash, subagents=once))


HOOK = {"webhook": {"secretRef": {"name": "hook", "key": "key"}}}
STANDUP = {"name": "standup", "cron": "30 9 * * 1-5", "timeZone": "Europe/Paris", "prompt": "go"}


def test_schedules_are_kept_by_the_api_server_and_refused_when_they_name_no_time(
    api: ApiClient, namespace: str
) -> None:
    created = create(api, namespace, agent("cron", **_model(**KEY), **HOOK, schedules=[STANDUP]))
    assert created["spec"]["schedules"] == [{**STANDUP, "suspend": False}]
    with pytest.raises(ApiException) as rejected:
        create(api, namespace, agent("bad", **_model(**KEY), **HOOK, schedules=[{"name": "x"}]))
    assert "spec.schedules[0].cron" in json.loads(rejected.value.body or "{}")["message"]
    assert parse_agent(created).spec.schedules[0].time_zone == "Europe/Paris"


@pytest.mark.parametrize(
    ("schedules", "hook", "says"),
    [
        ([{**STANDUP, "cron": "61 * * * *"}], HOOK, "not a cron expression: '61 * * * *'"),
        ([{**STANDUP, "cron": "0 0 30 2 *"}], HOOK, "'0 0 30 2 *' is never due"),
        ([{**STANDUP, "timeZone": "Mars/Olympus"}], HOOK, "unknown time zone 'Mars/Olympus'"),
        ([STANDUP, STANDUP], HOOK, "names must be unique; repeated: standup"),
        ([STANDUP], {}, "spec.schedules needs spec.webhook"),
    ],
    ids=["bad-field", "never-due", "unknown-zone", "twice", "unsigned"],
)
def test_the_spec_refuses_a_schedule_that_cannot_work(
    schedules: list[dict[str, Any]], hook: dict[str, Any], says: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse_agent(agent("cron", **_model(**KEY), **hook, schedules=schedules))
    assert says in str(refused.value)


def test_a_models_own_spend_cap_is_kept_beside_the_agents(api: ApiClient, namespace: str) -> None:
    caps = [DAILY, {**DAILY, "model": "c"}, {**DAILY, "per": "hour", "model": "anthropic/c"}]
    created = create(api, namespace, agent("tiers", **_capped(*caps)))
    assert created["spec"]["limits"]["spendCaps"] == caps
    [_, day, hour] = parse_agent(created).spec.limits.spend_caps or []
    assert (day.model, hour.model) == ("c", "anthropic/c")
