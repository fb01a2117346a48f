"""Who owns a Restate service name.

A DurableAgent's versions and sidecar serve Restate services named after the agent (`<agent>`,
`<agent>-inbox`, `<agent>-parked`, `<agent>-live`), and Restate's service namespace is flat:
`triage` in team-a and `triage` in team-b would take the services from each other
(registrations are forced, so the last one wins and the other's runs go to its worker). Before
registering, the operator looks for another owner of the names and refuses while one exists:
another DurableAgent that still exists, or a deployment tether did not register.
"""

from __future__ import annotations

from tether.spec import restate_services

from .context import Operator
from .kube import KubeError
from .names import GROUP, RESTATE_AGENT_KEY, VERSION, restate_agent


async def _agent_exists(op: Operator, owner: str) -> bool:
    namespace, _, name = owner.partition("/")
    try:
        return await op.kube.get(f"{GROUP}/{VERSION}", "DurableAgent", namespace, name) is not None
    except KubeError:
        return True  # not allowed to look (or no answer): assume it is there


async def other_owner(op: Operator, namespace: str, agent: str) -> str | None:
    """What else serves one of the agent's Restate services, in words, or None if nothing does.

    A deployment registered for a DurableAgent that no longer exists (deleted while no operator
    ran) does not count: the agent that now has the name takes the service over."""
    mine = restate_agent(namespace, agent)
    names = set(restate_services(agent))
    for deployment in await op.restate.deployments():
        if not any(service.get("name") in names for service in deployment.get("services", [])):
            continue
        owner = (deployment.get("metadata") or {}).get(RESTATE_AGENT_KEY)
        if owner == mine:
            continue
        if owner is None:
            return (
                f"Restate deployment {deployment.get('id')} at {deployment.get('uri')}, "
                "which tether did not register"
            )
        if await _agent_exists(op, owner):
            return f"DurableAgent {owner}"
    return None
