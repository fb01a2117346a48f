"""Sidecar settings, read from the environment (the operator fills it from the spec and Secrets).

| variable | meaning |
|---|---|
| `RESTATE_INGRESS_URL` | Restate's ingress, e.g. `http://restate:8080`, or its nodes' (required) |
| `TETHER_AGENT` | the agent's Restate service name (required) |
| `TETHER_WEBHOOK_SECRET` | the HMAC secret of webhooks and links, from a Secret (required) |
| `PROMETHEUS_MULTIPROC_DIR` | the directory the worker writes its metrics to (optional) |
| `TETHER_SIDECAR_MAX_BODY_BYTES` | largest webhook body accepted (default 65536) |
| `TETHER_SIDECAR_PARKED_CACHE_SECONDS` | seconds a read of the parked calls is reused (2) |
| `TETHER_SLACK_SIGNING_SECRET` | the Slack app's signing secret, from a Secret (optional) |
| `TETHER_SLACK_RESPONSE_URL_PREFIX` | where replies to clicks go (`https://hooks.slack.com/`) |

Without `TETHER_SLACK_SIGNING_SECRET`, `/v1/slack/interactions` refuses every click.
`RESTATE_INGRESS_URL` may list a cluster's nodes, comma-separated (`http://n1:8080,http://n2:8080`):
a call whose connection fails goes to the next.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from ...errors import ConfigError
from ...secret_env import PREVIOUS_SECRET_ENV, SLACK_SIGNING_SECRET_ENV
from ..restate_endpoints import split_urls

MIN_SECRET_LENGTH = 16

ENV_NAMES: dict[str, str] = {
    "restate_ingress_url": "RESTATE_INGRESS_URL",
    "agent": "TETHER_AGENT",
    "webhook_secret": "TETHER_WEBHOOK_SECRET",
    "previous_webhook_secret": PREVIOUS_SECRET_ENV,
    "prometheus_multiproc_dir": "PROMETHEUS_MULTIPROC_DIR",
    "max_body_bytes": "TETHER_SIDECAR_MAX_BODY_BYTES",
    "parked_cache_seconds": "TETHER_SIDECAR_PARKED_CACHE_SECONDS",
    "slack_signing_secret": SLACK_SIGNING_SECRET_ENV,
    "slack_response_url_prefix": "TETHER_SLACK_RESPONSE_URL_PREFIX",
}


class SidecarConfigError(ConfigError):
    """The environment does not describe a usable sidecar; the message names the variables."""


class SidecarSettings(BaseModel):
    """What the sidecar needs to know. `webhook_secret` never shows in a repr or a log."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    restate_ingress_url: str
    """One URL, or a cluster's nodes' separated by commas (tried in turn)."""
    agent: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
    webhook_secret: SecretStr = Field(min_length=MIN_SECRET_LENGTH)
    previous_webhook_secret: SecretStr | None = Field(default=None, min_length=MIN_SECRET_LENGTH)
    """During a rotation: the key being replaced, still accepted, never used to sign."""
    prometheus_multiproc_dir: Path | None = None
    max_body_bytes: int = Field(default=65536, ge=1, le=16 * 1024 * 1024)
    parked_cache_seconds: float = Field(default=2.0, ge=0, le=300)
    slack_signing_secret: SecretStr | None = Field(default=None, min_length=MIN_SECRET_LENGTH)
    """`approvals.notify.format: slack`: authenticates the clicks Slack sends."""
    slack_response_url_prefix: str = "https://hooks.slack.com/"
    """The only place the sidecar posts a click's answer to (a `response_url` comes from a
    request signed by Slack; this keeps a leaked signing secret from aiming the sidecar at
    Restate's ingress or anything else it reaches)."""

    @field_validator("restate_ingress_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        try:
            return ",".join(split_urls(value))
        except ValueError:
            raise ValueError(
                "must be an http:// or https:// URL, or several separated by commas"
            ) from None

    @field_validator("slack_response_url_prefix")
    @classmethod
    def _url_prefix(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or value.count("/") < 3:
            raise ValueError("must be an http:// or https:// URL up to a '/' after the host")
        return value

    @field_validator("prometheus_multiproc_dir")
    @classmethod
    def _existing_directory(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError("is not a directory (mount the emptyDir the worker writes to)")
        return value

    @property
    def secret(self) -> bytes:
        """The key that signs (links' form tokens, answers' proofs, listing tokens)."""
        return self.webhook_secret.get_secret_value().encode()

    @property
    def secrets(self) -> tuple[bytes, ...]:
        """The keys a signature is accepted from: the current one, then the previous one."""
        previous = self.previous_webhook_secret
        return (self.secret,) + ((previous.get_secret_value().encode(),) if previous else ())

    @property
    def slack_secret(self) -> bytes | None:
        """The Slack app's signing secret, if Slack's clicks are taken."""
        secret = self.slack_signing_secret
        return secret.get_secret_value().encode() if secret is not None else None


def settings_from_env(env: Mapping[str, str] | None = None) -> SidecarSettings:
    """Read the settings; raise `SidecarConfigError` naming every variable that is wrong."""
    source = os.environ if env is None else env
    values: dict[str, Any] = {
        field: source[name] for field, name in ENV_NAMES.items() if source.get(name)
    }
    try:
        return SidecarSettings(**values)
    except ValidationError as error:
        raise SidecarConfigError(_describe(error)) from None


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors(include_input=False, include_url=False):
        field = str(item["loc"][0]) if item["loc"] else ""
        name = ENV_NAMES.get(field, field)
        if item["type"] == "missing":
            problems.append(f"{name} is not set")
        elif field == "agent":
            problems.append(
                f"{name} must be the agent's Restate service name (letters, digits, '_', '.', "
                "'-'; starting with a letter or '_')"
            )
        elif field in ("webhook_secret", "previous_webhook_secret", "slack_signing_secret"):
            problems.append(f"{name} must be at least {MIN_SECRET_LENGTH} characters long")
        else:
            problems.append(f"{name}: {item['msg'].removeprefix('Value error, ')}")
    return "invalid sidecar settings: " + "; ".join(problems)
