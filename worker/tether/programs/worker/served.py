"""What a worker serves: `tether worker --serve all | agent | index` (`TETHER_WORKER_SERVES`).

- `agent`: the runs (`services.agent_services`): the agent's object.
- `index`: what the runs of every version share, and the sidecars read (`index_services`): the
  index of parked calls `<agent>-parked`, the live events `<agent>-live` and the sessions
  clients watch `<agent>-watchers`, the sessions' inboxes `<agent>-inbox`, the tool results
  handed between replicas `<agent>-handoff`, the slots of rate-limited models' calls
  `<agent>-pace`, the schedules that start runs `<agent>-schedule`, what all runs spend against
  the spend caps `<agent>-spend` and, when runs with
  sub-agents have a budget, the budget ledgers `<agent>-budget`. They need the webhook secrets
  and nothing of the agent's loop (no model key, provider, tools or MCP clients), so they are
  served from the sidecar's pods, up whichever versions have pods: a version woken from zero to
  finish a run takes its messages and budget there, without waking the active version too.
- `all` (the default; `tether dev`): both, in one deployment.

A run reaches these objects by service name, through Restate, wherever they are served.
"""

from __future__ import annotations

import restate

from ...spec import DurableAgentSpec, EventsSpec
from .handoff import handoff_object
from .inbox import inbox_object
from .live import live_object
from .pace import pace_object
from .parked_index import ParkedIndex
from .schedule import schedule_object
from .settings import WorkerSettings
from .spend import spend_object
from .watchers import watchers_object


def shares_a_budget(spec: DurableAgentSpec) -> bool:
    """Whether runs keep a budget ledger: sub-agents run at once as invocations of their own, so
    one ledger per root run keeps them all within its budget (a run alone checks it itself)."""
    limits = spec.limits
    return spec.subagents is not None and bool(limits.max_cost_usd or limits.max_tokens)


def index_services(settings: WorkerSettings) -> list[restate.VirtualObject]:
    """`<agent>-parked`, `<agent>-live`, `<agent>-handoff`, `<agent>-pace`, `<agent>-schedule`
    `<agent>-spend` and `<agent>-watchers` (checked with the webhook secrets), `<agent>-inbox`,
    and `<agent>-budget` when the runs share a budget."""
    agent, secrets, spec = settings.agent_name, settings.webhook_secrets, settings.manifest.spec
    kept = spec.events or EventsSpec()
    served = [
        ParkedIndex(agent, secrets).object,
        live_object(agent, secrets, kept.live_batches),
        watchers_object(agent, secrets),
        inbox_object(agent)[0],
        handoff_object(agent, secrets),
        pace_object(agent, secrets),
        schedule_object(agent, secrets),
        spend_object(agent, secrets),
    ]
    if shares_a_budget(spec):
        # Imported here: both load the agent's loop, which an index without a ledger needs
        # none of.
        from ...restate.budget import budget_object
        from ..metrics import budget_observer

        served.append(budget_object(agent, budget_observer(agent))[0])
    return served


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
