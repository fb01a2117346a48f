"""Worker settings from the environment (the operator fills them from the spec and Secrets)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ...errors import ConfigError
from ...spec import NOTIFY_URL, PREVIOUS_SECRET_ENV, DurableAgent, SpecError, load_agent
from ..restate_endpoints import split_urls
from ..restate_identity import identity_keys_from_env


@dataclass(frozen=True)
class WorkerSettings:
    manifest: DurableAgent
    spec_path: Path
    webhook_secret: bytes | None
    """Signs approval links; from the Secret of `spec.webhook.secretRef`."""
    webhook_base_url: str | None
    """Public base URL of the sidecar, for the links in approval notifications."""
    workspace: Path
    env: Mapping[str, str]
    previous_webhook_secret: bytes | None = None
    """During a rotation, the key being replaced: accepted from the sidecars, never signing."""
    notify_url: str | None = None
    """Where parked calls are announced: `spec.approvals.notify.url`, or the environment
    variable `urlEnv` (default `TETHER_NOTIFY_URL`), which the operator fills from the Secret of
    `spec.approvals.notify.urlSecretRef`. A credential: never logged whole."""
    identity_keys: tuple[str, ...] = ()
    """Restate's request identity keys: requests not signed with one are refused (401)."""
    ingress_url: str | None = None
    """Restate's ingress (`RESTATE_INGRESS_URL`: one URL, or a cluster's nodes' separated by
    commas), where live events go; none: no live events."""

    @property
    def agent_name(self) -> str:
        return self.manifest.metadata.name

    @property
    def webhook_secrets(self) -> tuple[bytes, ...]:
        """The keys accepted from the sidecars: the current one, then the previous one."""
        keys = (self.webhook_secret, self.previous_webhook_secret)
        return tuple(key for key in keys if key)

    @property
    def secret_variables(self) -> list[str]:
        """Variables the spec names that hold secrets: `apiKeyEnv`, the notify URL's, MCP
        headers'."""
        spec = self.manifest.spec
        names = [spec.model.api_key_env]
        if spec.approvals.notify is not None and spec.approvals.notify.url is None:
            names.append(spec.approvals.notify.url_variable)
        for entry in spec.tools:  # MCP headers from Secrets
            headers = entry.mcp.headers if entry.mcp else []
            names.extend(h.variable(entry.name) for h in headers if h.value is None)
        return [name for name in names if name]


def settings_from_env(env: Mapping[str, str] | None = None) -> WorkerSettings:
    env = dict(os.environ if env is None else env)
    spec_path = env.get("TETHER_SPEC")
    if not spec_path:
        raise SpecError("TETHER_SPEC is not set: point it at the DurableAgent manifest")
    secret = env.get("TETHER_WEBHOOK_SECRET")
    manifest = load_agent(spec_path)
    return WorkerSettings(
        manifest=manifest,
        spec_path=Path(spec_path).resolve(),
        webhook_secret=secret.encode() if secret else None,
        previous_webhook_secret=env.get(PREVIOUS_SECRET_ENV, "").encode() or None,
        webhook_base_url=env.get("TETHER_WEBHOOK_BASE_URL") or None,
        workspace=Path(env.get("TETHER_WORKSPACE", "/tmp")),
        env=env,
        notify_url=notify_url_from_env(manifest, env),
        identity_keys=tuple(identity_keys_from_env(env)),
        ingress_url=_ingress_url(env),
    )


def _ingress_url(env: Mapping[str, str]) -> str | None:
    value = env.get("RESTATE_INGRESS_URL", "").strip()
    if not value:
        return None
    try:
        return ",".join(split_urls(value))
    except ValueError:
        raise ConfigError(
            "RESTATE_INGRESS_URL must be an http:// or https:// URL, or several separated by commas"
        ) from None


def notify_url_from_env(manifest: DurableAgent, env: Mapping[str, str]) -> str | None:
    """The URL of `spec.approvals.notify`: its `url`, or the environment variable it names;
    a clear error (that does not repeat the value) when that is unset or not a URL."""
    notify = manifest.spec.approvals.notify
    if notify is None:
        return None
    if notify.url is not None:
        return notify.url
    variable = notify.url_variable
    url = env.get(variable, "").strip()
    if not url:
        raise SpecError(
            f"{variable} is not set: spec.approvals.notify takes the URL that parked calls are "
            "announced to from it (on Kubernetes the operator maps it in from "
            "spec.approvals.notify.urlSecretRef); set it, or remove spec.approvals.notify"
        )
    if not re.match(NOTIFY_URL, url):
        raise SpecError(f"{variable} must hold an http:// or https:// URL")
    return url
