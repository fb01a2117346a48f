"""What the handlers share: the operator-wide clients, and a small memory per DurableAgent."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import kopf

from tether.spec import DurableAgentStatus

from .conditions import Verdict
from .kube import Kube
from .restate_admin import RestateAdmin, RestateApi, RestateObserver
from .settings import OperatorSettings


@dataclass
class Backoff:
    """Exponential backoff between attempts of one step: 1 s, 2 s, 4 s ... `ceiling`."""

    ceiling: float = 30.0
    failures: int = 0
    not_before: float = 0.0

    def ready(self) -> bool:
        return time.monotonic() >= self.not_before

    def failed(self) -> float:
        delay = min(2.0**self.failures, self.ceiling)
        self.failures += 1
        self.not_before = time.monotonic() + delay
        return delay

    def succeeded(self) -> None:
        self.failures, self.not_before = 0, 0.0


@dataclass
class AgentMemory:
    """Kept in kopf's per-object memo for as long as this process runs."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    status: DurableAgentStatus | None = None
    """The status last written: this operator is its only writer."""
    applied: str | None = None
    applied_at: float = 0.0
    blocker: Verdict | None = None
    """Why the current spec cannot be rolled out (a missing Secret); set by the rollout handler."""
    registration: Backoff = field(default_factory=Backoff)
    registration_problem: Verdict | None = None
    unanswered_since: dict[str, float] = field(default_factory=dict)
    """When each version's URL was first found not answering, though its pods were ready."""
    restate_problem: Verdict | None = None
    synced: bool = False
    """Restate's deployments and the children were compared with the status once."""
    urls: dict[str, str] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    """Warning events already posted, so a retried failure is reported once."""
    mcp_rules: list[dict[str, Any]] | None = None
    """The egress rules to the agent's in-cluster MCP servers last applied, and when they were
    last looked up: a Service created or changed after the agent is picked up."""
    mcp_checked_at: float = 0.0
    resume_due: set[str] = field(default_factory=set)
    """Versions woken from zero whose paused runs are resumed once they have pods."""
    cancelled_at: dict[str, float] = field(default_factory=dict)
    """When the runs still pinned to a draining version were cancelled at its drain.timeout
    (monotonic seconds), by `<hash>@<draining since>`: those left after `CANCEL_GRACE` are
    killed."""
    recommended: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    """Per version, the replicas its active runs needed at each pass within scaleDownAfter
    (`scaling.autoscale`): it loses pods only down to the most of them."""
    scaling_restored: bool = False
    """The scaler took what it must remember from the status and the Deployments once."""
    gauges: set[str] = field(default_factory=set)
    """The versions whose gauges this process reports."""
    schedule_gauges: set[str] = field(default_factory=set)
    """The schedules whose gauges this process reports."""
    spend_gauges: set[tuple[str, str]] = field(default_factory=set)
    """The spend caps (by period and model) whose gauges this process reports."""

    def warn_once(self, body: kopf.Body, reason: str, message: str) -> None:
        """A warning event, once for as long as this process runs (a retried failure)."""
        key = f"{reason}:{message}"
        if key not in self.warned:
            self.warned.add(key)
            kopf.warn(body, reason=reason, message=message)


@dataclass
class Operator:
    settings: OperatorSettings
    kube: Kube
    restate: RestateAdmin
    observer: RestateObserver
    ingress: RestateApi
    last_pass: float = field(default_factory=time.monotonic)
    agents: dict[tuple[str, str], tuple[AgentMemory, kopf.Body]] = field(default_factory=dict)
    """Each agent's memory and latest body by (namespace, name), so a Deployment event can run
    the agent's supervision pass at once instead of waiting for its next timer tick."""

    async def close(self) -> None:
        await self.kube.close()
        await self.restate.close()
        await self.ingress.close()


def operator_of(memo: Any) -> Operator:
    op: Operator = memo.operator
    return op


def memory_of(memo: kopf.Memo) -> AgentMemory:
    """The object's memory, made on first use (kopf gives each object its own memo)."""
    if "agent" not in memo:
        memo["agent"] = AgentMemory()
    mem: AgentMemory = memo["agent"]
    return mem
