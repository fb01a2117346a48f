"""What a worker serves: `tether worker --serve all | agent | index` (`TETHER_WORKER_SERVES`).

- `agent`: the runs (`services.agent_services`): the agent's object, its inbox and budget ledger.
- `index`: the agent's index of parked calls `<agent>-parked` and its live events `<agent>-live`
  (`index_services`), which the sidecars list, answer and read through. They need the webhook
  secrets and nothing of the agent's loop (no model key, provider, tools or MCP clients), so
  they can be served from the sidecar's pods while the agent's versions scale to zero.
- `all` (the default; `tether dev`): both, in one deployment.

A run reaches the index and the live object by service name, through Restate, wherever they are
served.
"""

from __future__ import annotations

import restate

from ...spec import EventsSpec
from .live import live_object
from .parked_index import ParkedIndex
from .settings import WorkerSettings


def index_services(settings: WorkerSettings) -> list[restate.VirtualObject]:
    """`<agent>-parked` and `<agent>-live`, checked with the webhook secrets."""
    agent, secrets = settings.agent_name, settings.webhook_secrets
    kept = settings.manifest.spec.events or EventsSpec()
    return [ParkedIndex(agent, secrets).object, live_object(agent, secrets, kept.live_batches)]


def served_services(settings: WorkerSettings) -> list[restate.VirtualObject]:
    """The services of `settings.serves`."""
    served: list[restate.VirtualObject] = []
    if settings.serves_agent:
        # Imported here: an index loads nothing of the agent's loop.
        from .services import agent_services

        served += agent_services(settings)
    if settings.serves_index:
        served += index_services(settings)
    return served
