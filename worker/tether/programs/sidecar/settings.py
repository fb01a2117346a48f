"""Sidecar settings, read from the environment (the operator fills it from the spec and Secrets).

| variable | meaning |
|---|---|
| `RESTATE_INGRESS_URL` | Restate's ingress, e.g. `http://restate:8080` (required) |
| `TETHER_AGENT` | the agent's Restate service name (required) |
| `TETHER_WEBHOOK_SECRET` | the HMAC secret of webhooks and links, from a Secret (required) |
| `PROMETHEUS_MULTIPROC_DIR` | the directory the worker writes its metrics to (optional) |
| `TETHER_SIDECAR_MAX_BODY_BYTES` | largest webhook body accepted (default 65536) |
| `TETHER_SIDECAR_PARKED_CACHE_SECONDS` | seconds a read of the parked calls is reused (2) |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from ...errors import ConfigError
from ...spec import PREVIOUS_SECRET_ENV

MIN_SECRET_LENGTH = 16

ENV_NAMES: dict[str, str] = {
    "restate_ingress_url": "RESTATE_INGRESS_URL",
    "agent": "TETHER_AGENT",
    "webhook_secret": "TETHER_WEBHOOK_SECRET",
    "previous_webhook_secret": PREVIOUS_SECRET_ENV,
    "prometheus_multiproc_dir": "PROMETHEUS_MULTIPROC_DIR",
    "max_body_bytes": "TETHER_SIDECAR_MAX_BODY_BYTES",
    "parked_cache_seconds": "TETHER_SIDECAR_PARKED_CACHE_SECONDS",
}


class SidecarConfigError(ConfigError):
    """The environment does not describe a usable sidecar; the message names the variables."""


class SidecarSettings(BaseModel):
    """What the sidecar needs to know. `webhook_secret` never shows in a repr or a log."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    restate_ingress_url: str
    agent: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")
    webhook_secret: SecretStr = Field(min_length=MIN_SECRET_LENGTH)
    previous_webhook_secret: SecretStr | None = Field(default=None, min_length=MIN_SECRET_LENGTH)
    """During a rotation: the key being replaced, still accepted, never used to sign."""
    prometheus_multiproc_dir: Path | None = None
    max_body_bytes: int = Field(default=65536, ge=1, le=16 * 1024 * 1024)
    parked_cache_seconds: float = Field(default=2.0, ge=0, le=300)

    @field_validator("restate_ingress_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or len(value) < 8:
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/")

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
        elif field in ("webhook_secret", "previous_webhook_secret"):
            problems.append(f"{name} must be at least {MIN_SECRET_LENGTH} characters long")
        else:
            problems.append(f"{name}: {item['msg'].removeprefix('Value error, ')}")
    return "invalid sidecar settings: " + "; ".join(problems)
