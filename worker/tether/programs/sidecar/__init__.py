"""The sidecar of a worker pod (FastAPI on :8000): awakeable webhooks (Tether's signature or
Standard Webhooks) and signed approval links, Slack's button clicks, the parked-call list,
Prometheus `/metrics` and health checks.

`tether sidecar` calls `serve(settings_from_env())`; tests use `create_app(settings)`.
"""

from __future__ import annotations

from ..._optional import extra_imports

with extra_imports("tether.programs.sidecar", "sidecar"):
    from .app import create_app
    from .server import serve
    from .settings import SidecarConfigError, SidecarSettings, settings_from_env

__all__ = ["SidecarConfigError", "SidecarSettings", "create_app", "serve", "settings_from_env"]
