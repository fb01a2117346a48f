"""The worker's ASGI app, for the hypercorn CLI: `hypercorn tether.worker.asgi:app`.

Settings come from the environment (`TETHER_SPEC` and the Secrets the operator maps in)."""

from __future__ import annotations

import restate

from .agent_object import agent_object
from .settings import settings_from_env

app = restate.app([agent_object(settings_from_env())])
