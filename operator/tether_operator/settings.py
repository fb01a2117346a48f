"""Operator settings, read once from the environment at start-up (see operator/README.md)."""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tether.errors import ConfigError
from tether.programs.restate_endpoints import split_urls
from tether.programs.restate_identity import identity_keys_from_env, public_key_of
from tether.spec import URL_QUERY, URL_USERINFO

IDENTITY_KEY_FILE_ENV = "TETHER_RESTATE_IDENTITY_KEY_FILE"
"""Restate's request-identity private key (PEM); the operator keeps only its public key."""
DEFAULT_WORKER_URL_TEMPLATE = "http://{service}.{namespace}.svc:{port}"
DEFAULT_WEBHOOK_URL_TEMPLATE = "http://{service}.{namespace}.svc:{port}"
DEFAULT_PEERING_LIFETIME = 15
"""Seconds a replica's peering record stays fresh: how long a replica that died without a word
(SIGKILL, a lost node) keeps the others waiting, at most. kopf refreshes the record 5 to 10 s
before it expires, so that margin, not the lifetime, absorbs a slow API server or clock skew."""
MIN_PEERING_LIFETIME = 5
OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
URL_FIELDS = frozenset({"service", "namespace", "agent", "hash", "port", "node_port"})


class SettingsError(ConfigError):
    """An environment variable the operator cannot work with."""


@dataclass(frozen=True)
class OperatorSettings:
    restate_admin_url: str
    """Restate's admin API, e.g. http://restate.restate.svc:9070 (`TETHER_RESTATE_ADMIN_URL`);
    or its nodes', separated by commas, tried in turn (`tether.programs.restate_endpoints`)."""
    restate_ingress_url: str
    """Restate's ingress, e.g. http://restate.restate.svc:8080 (`TETHER_RESTATE_INGRESS_URL`),
    or its nodes'; given as it is to the workers and the sidecars."""
    worker_image: str
    """Image of the worker and sidecar containers unless `spec.worker.image` says otherwise."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty means all (`TETHER_NAMESPACES`, comma-separated)."""
    worker_url_template: str = DEFAULT_WORKER_URL_TEMPLATE
    """How Restate reaches a version's Service. Fields: {service} {namespace} {agent} {hash}
    {port} {node_port}."""
    worker_service_type: str = "ClusterIP"
    """ClusterIP, or NodePort when Restate runs outside the cluster (then use {node_port})."""
    webhook_url_template: str = DEFAULT_WEBHOOK_URL_TEMPLATE
    """The public base URL of an agent's sidecars (webhooks); same fields, port 8000."""
    image_pull_policy: str = "IfNotPresent"
    reconcile_interval: float = 1.0
    """Seconds between two supervision passes of one agent (registration, drain, status)."""
    restate_timeout: float = 30.0
    """Seconds one admin API call (registration includes discovery) may take."""
    parked_refresh: float = 5.0
    """Seconds a parked-calls count from Restate is reused before it is asked again."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra labels on every child (`TETHER_EXTRA_LABELS`, k=v,k=v)."""
    agent_egress: tuple[dict[str, Any], ...] | None = None
    """The egress rules of the NetworkPolicy each agent's pods get (besides DNS), as the chart
    renders them (`TETHER_AGENT_EGRESS`, a JSON list of NetworkPolicyEgressRule): Restate's
    ingress and the internet outside private ranges by default. None: no egress policy."""
    restate_identity_keys: tuple[str, ...] = ()
    """Restate's request-identity public keys, which the workers accept requests signed with:
    derived from its private key (`TETHER_RESTATE_IDENTITY_KEY_FILE`, the chart's Secret), or
    given (`TETHER_RESTATE_IDENTITY_KEYS`, for a Restate of your own). None: the workers take
    any request that reaches them."""
    metrics_port: int = 8000
    """Where the operator serves its Prometheus metrics (`/metrics`, all addresses); 0: not
    served (`TETHER_METRICS_PORT`)."""
    otlp_endpoint: str | None = None
    """The OTLP/HTTP collector of the agents that name none in `spec.observability`
    (`TETHER_OTLP_ENDPOINT`, the chart's `observability.otlpEndpoint`). None: no traces."""
    peering: str | None = None
    """The kopf peering object the replicas of this operator share (`TETHER_PEERING`): a
    ClusterKopfPeering when it watches all namespaces, a KopfPeering of that name in each watched
    namespace otherwise. One replica acts, the others wait (see `peering.py`). None: standalone,
    a single replica (`tether dev`, the tests, a plain `kopf run --standalone`)."""
    peering_lifetime: int = DEFAULT_PEERING_LIFETIME
    """Seconds this replica's peering record stays fresh (`TETHER_PEERING_LIFETIME`)."""
    peering_priority: int | None = None
    """This replica's peering priority (`TETHER_PEERING_PRIORITY`); None: the oldest replica
    leads (the priority falls with the process's start time)."""

    @property
    def public_ingress_url(self) -> str:
        """The ingress URL a status shows (the first of several)."""
        return split_urls(self.restate_ingress_url)[0]

    def worker_url(self, **values: str | int) -> str:
        return self.worker_url_template.format(**values).rstrip("/")

    def webhook_url(self, **values: str | int) -> str:
        return self.webhook_url_template.format(**values).rstrip("/")


def _template(env: Mapping[str, str], name: str, default: str) -> str:
    value = env.get(name) or default
    used = {f for _, f, _, _ in string.Formatter().parse(value) if f}
    unknown = used - URL_FIELDS
    if unknown:
        raise SettingsError(
            f"{name}={value!r} uses unknown fields {sorted(unknown)}; "
            f"use only {{{'}, {'.join(sorted(URL_FIELDS))}}}"
        )
    return value


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise SettingsError(f"{name}={raw!r} must be greater than zero")
    return value


def _port(env: Mapping[str, str], name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) > 65535:
        raise SettingsError(f"{name}={raw!r} is not a port number (0 to 65535; 0: off)")
    return int(raw)


def _labels(raw: str) -> dict[str, str]:
    pairs = [p.strip() for p in raw.split(",") if p.strip()]
    labels: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SettingsError(f"TETHER_EXTRA_LABELS: {pair!r} is not key=value")
        labels[key] = value
    return labels


def _urls(env: Mapping[str, str], name: str) -> str:
    try:
        return ",".join(split_urls(env[name]))
    except ValueError:
        raise SettingsError(
            f"{name} must be an http:// or https:// URL, or several separated by commas (the "
            "nodes of one Restate cluster)"
        ) from None


def _egress(env: Mapping[str, str]) -> tuple[dict[str, Any], ...] | None:
    raw = env.get("TETHER_AGENT_EGRESS")
    if not raw:
        return None
    try:
        rules = json.loads(raw)
    except ValueError as error:
        raise SettingsError(f"TETHER_AGENT_EGRESS is not JSON: {error}") from None
    if not isinstance(rules, list) or not all(isinstance(rule, dict) for rule in rules):
        raise SettingsError("TETHER_AGENT_EGRESS must be a JSON list of NetworkPolicy egress rules")
    return tuple(rules)


def _identity_keys(env: Mapping[str, str]) -> tuple[str, ...]:
    keys = identity_keys_from_env(env)
    path = env.get(IDENTITY_KEY_FILE_ENV)
    if path:
        try:
            keys.insert(0, public_key_of(Path(path).read_bytes()))
        except OSError as error:
            raise SettingsError(f"{IDENTITY_KEY_FILE_ENV}={path!r}: {error.strerror}") from None
    return tuple(dict.fromkeys(keys))


def _otlp_endpoint(env: Mapping[str, str]) -> str | None:
    value = (env.get("TETHER_OTLP_ENDPOINT") or "").strip()
    if not value:
        return None
    if not re.match(r"^https?://[^/?#]", value) or re.search(URL_USERINFO, value):
        raise SettingsError(
            "TETHER_OTLP_ENDPOINT must be the http:// or https:// base URL of an OTLP/HTTP "
            "collector, without user information (e.g. http://otel-collector.observability:4318)"
        )
    if re.search(URL_QUERY, value):
        raise SettingsError("TETHER_OTLP_ENDPOINT must not carry a query or a fragment")
    return value


def _peering(env: Mapping[str, str]) -> tuple[str | None, int, int | None]:
    name = (env.get("TETHER_PEERING") or "").strip() or None
    if name is not None and not OBJECT_NAME.match(name):
        raise SettingsError(
            f"TETHER_PEERING={name!r} is not a Kubernetes object name (the peering object's)"
        )
    raw = (env.get("TETHER_PEERING_LIFETIME") or "").strip()
    lifetime = DEFAULT_PEERING_LIFETIME
    if raw:
        if not raw.isdigit() or int(raw) < MIN_PEERING_LIFETIME:
            raise SettingsError(
                f"TETHER_PEERING_LIFETIME={raw!r} must be a whole number of seconds, at least "
                f"{MIN_PEERING_LIFETIME}"
            )
        lifetime = int(raw)
    raw = (env.get("TETHER_PEERING_PRIORITY") or "").strip()
    priority = None
    if raw:
        try:
            priority = int(raw)
        except ValueError:
            raise SettingsError(f"TETHER_PEERING_PRIORITY={raw!r} is not an integer") from None
    return name, lifetime, priority


def settings_from_env(env: Mapping[str, str] | None = None) -> OperatorSettings:
    """Read `TETHER_*` variables; a missing required one is a `SettingsError` naming it."""
    env = os.environ if env is None else env
    missing = [
        name
        for name in (
            "TETHER_RESTATE_ADMIN_URL",
            "TETHER_RESTATE_INGRESS_URL",
            "TETHER_WORKER_IMAGE",
        )
        if not env.get(name)
    ]
    if missing:
        raise SettingsError(f"set {', '.join(missing)} (see operator/README.md)")
    service_type = env.get("TETHER_WORKER_SERVICE_TYPE") or "ClusterIP"
    if service_type not in ("ClusterIP", "NodePort"):
        raise SettingsError(f"TETHER_WORKER_SERVICE_TYPE={service_type!r}: ClusterIP or NodePort")
    peering, peering_lifetime, peering_priority = _peering(env)
    return OperatorSettings(
        restate_admin_url=_urls(env, "TETHER_RESTATE_ADMIN_URL"),
        restate_ingress_url=_urls(env, "TETHER_RESTATE_INGRESS_URL"),
        worker_image=env["TETHER_WORKER_IMAGE"],
        namespaces=tuple(
            n.strip() for n in env.get("TETHER_NAMESPACES", "").split(",") if n.strip()
        ),
        worker_url_template=_template(
            env, "TETHER_WORKER_URL_TEMPLATE", DEFAULT_WORKER_URL_TEMPLATE
        ),
        worker_service_type=service_type,
        webhook_url_template=_template(
            env, "TETHER_WEBHOOK_URL_TEMPLATE", DEFAULT_WEBHOOK_URL_TEMPLATE
        ),
        image_pull_policy=env.get("TETHER_IMAGE_PULL_POLICY") or "IfNotPresent",
        reconcile_interval=_number(env, "TETHER_RECONCILE_INTERVAL", 1.0),
        restate_timeout=_number(env, "TETHER_RESTATE_TIMEOUT", 30.0),
        parked_refresh=_number(env, "TETHER_PARKED_REFRESH", 5.0),
        labels=_labels(env.get("TETHER_EXTRA_LABELS", "")),
        agent_egress=_egress(env),
        restate_identity_keys=_identity_keys(env),
        metrics_port=_port(env, "TETHER_METRICS_PORT", 8000),
        otlp_endpoint=_otlp_endpoint(env),
        peering=peering,
        peering_lifetime=peering_lifetime,
        peering_priority=peering_priority,
    )
