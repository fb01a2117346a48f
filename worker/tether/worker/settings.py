"""Worker settings from the environment (the operator fills them from the spec and Secrets)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..spec import DurableAgent, SpecError, load_agent


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

    @property
    def agent_name(self) -> str:
        return self.manifest.metadata.name


def settings_from_env(env: Mapping[str, str] | None = None) -> WorkerSettings:
    env = dict(os.environ if env is None else env)
    spec_path = env.get("TETHER_SPEC")
    if not spec_path:
        raise SpecError("TETHER_SPEC is not set: point it at the DurableAgent manifest")
    secret = env.get("TETHER_WEBHOOK_SECRET")
    return WorkerSettings(
        manifest=load_agent(spec_path),
        spec_path=Path(spec_path).resolve(),
        webhook_secret=secret.encode() if secret else None,
        webhook_base_url=env.get("TETHER_WEBHOOK_BASE_URL") or None,
        workspace=Path(env.get("TETHER_WORKSPACE", "/tmp")),
        env=env,
    )
