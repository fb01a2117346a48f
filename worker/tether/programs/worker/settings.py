"""Worker settings from the environment (the operator fills them from the spec and Secrets)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ...errors import ConfigError
from ...secret_env import PREVIOUS_SECRET_ENV
from ...spec import NOTIFY_URL, DurableAgent, SpecError, load_agent
from ..restate_endpoints import split_urls
from ..restate_identity import identity_keys_from_env

Serves = Literal["all", "agent", "index"]
"""What a worker serves (`tether worker --serve`; `tether.programs.worker.served`)."""
SERVES: tuple[Serves, ...] = get_args(Serves)
SERVES_ENV = "TETHER_WORKER_SERVES"
METRICS_PORT_ENV = "TETHER_WORKER_METRICS_PORT"


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
    serves: Serves = "all"
    """`agent`: the agent's object, inbox and budget ledger; `index`: its index of parked calls
    and its live events; `all`: both."""
    metrics_port: int | None = None
    """The port of the worker's own `/metrics` (`tether.programs.worker.metrics_port`); none:
    no metrics port."""

    @property
    def serves_agent(self) -> bool:
        return self.serves in ("all", "agent")

    @property
    def serves_index(self) -> bool:
        return self.serves in ("all", "index")

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
        """Variables the spec names that hold secrets: the models' keys, the notify URL's, MCP
        headers'."""
        return self.manifest.spec.secret_variables()


def settings_from_env(env: Mapping[str, str] | None = None) -> WorkerSettings:
    env = dict(os.environ if env is None else env)
    spec_path = env.get("TETHER_SPEC")
    if not spec_path:
        raise SpecError("TETHER_SPEC is not set: point it at the DurableAgent manifest")
    secret = env.get("TETHER_WEBHOOK_SECRET")
    manifest = load_agent(spec_path)
    serves = serves_from_env(env)
    return WorkerSettings(
        manifest=manifest,
        spec_path=Path(spec_path).resolve(),
        webhook_secret=secret.encode() if secret else None,
        previous_webhook_secret=env.get(PREVIOUS_SECRET_ENV, "").encode() or None,
        webhook_base_url=env.get("TETHER_WEBHOOK_BASE_URL") or None,
        workspace=Path(env.get("TETHER_WORKSPACE", "/tmp")),
        env=env,
        # Only the runs announce parked calls: an index needs no notify URL.
        notify_url=notify_url_from_env(manifest, env) if serves != "index" else None,
        identity_keys=tuple(identity_keys_from_env(env)),
        ingress_url=_ingress_url(env),
        serves=serves,
        metrics_port=metrics_port_from_env(env),
    )


def serves_from_env(env: Mapping[str, str]) -> Serves:
    """`TETHER_WORKER_SERVES` (default `all`); a clear error for anything else."""
    value = env.get(SERVES_ENV, "").strip() or "all"
    if value not in SERVES:
        raise ConfigError(
            f"{SERVES_ENV} must be all, agent or index (what the worker serves: the agent with "
            "its index of parked calls and live events, the agent alone, or that index alone), "
            f"not {value!r}"
        )
    return value


def metrics_port_from_env(env: Mapping[str, str]) -> int | None:
    """`TETHER_WORKER_METRICS_PORT`, the port of the worker's own `/metrics` (none if unset)."""
    value = env.get(METRICS_PORT_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(
            f"{METRICS_PORT_ENV} must be a port number from 1 to 65535 (where the worker "
            "serves its own /metrics), or unset"
        )
    return int(value)


def without_agent_secrets(settings: WorkerSettings) -> dict[str, str]:
    """The environment of a worker that serves only the index: its settings' minus the
    secrets only the agent's runs use (the model's key, the notify URL, MCP servers' headers),
    so the process holds only the webhook secrets and Restate's identity keys."""
    from ...spec import DEFAULT_KEY_ENV

    dropped = {*settings.secret_variables, *DEFAULT_KEY_ENV.values()}
    return {name: value for name, value in settings.env.items() if name not in dropped}


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
