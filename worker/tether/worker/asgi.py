"""The worker's ASGI app, for the hypercorn CLI: `hypercorn tether.worker.asgi:app`.

Settings come from the environment (`TETHER_SPEC` and the Secrets the operator maps in)."""

from __future__ import annotations

import sys

import restate

from .agent_object import agent_services
from .settings import settings_from_env

settings = settings_from_env()
# `python:` tools of a manifest may sit next to it (an example); images install them instead.
sys.path.insert(0, str(settings.spec_path.parent))
app = restate.app(agent_services(settings))
