"""What the agent's runs spent in the current period of each of its spend caps
(`limits.spendCaps`), as the index's `<agent>-spend/all` counts it
(`tether.programs.worker.spend`): shown in the status and as a gauge, for an alert before runs
are refused. Read with one cached query for all agents, as the schedules are."""

from __future__ import annotations

import time
from typing import Any

from tether.periods import Window
from tether.spec import DurableAgent, SpendCapSpec, SpendStatus, restate_services

from .conditions import rfc3339
from .context import Operator
from .restate_admin import RestateError
from .state_values import number_in


async def observed(op: Operator, agent: DurableAgent, kept: list[SpendStatus]) -> list[SpendStatus]:
    """Each cap's current period as Restate counts it (`kept`, the status's, when Restate does
    not answer)."""
    caps = agent.spec.limits.spend_caps or []
    if not caps:
        return []
    try:
        counted = await op.observer.spend(restate_services(agent.metadata.name).spend)
    except RestateError:
        return kept
    spent = counted.get("spent")
    now = time.time()
    return [
        _status(cap, agent.spec.model.label_of(cap.model) if cap.model else None, now, spent)
        for cap in caps
    ]


def _amount(found: Any, key: str) -> float:
    return max(0.0, number_in(found, key) or 0.0)


def _status(cap: SpendCapSpec, model: str | None, now: float, spent: Any) -> SpendStatus:
    window = Window.of(cap.per, now, cap.time_zone)
    amount = spent.get(window.key(model)) if isinstance(spent, dict) else None
    cost, tokens = _amount(amount, "cost_usd"), int(_amount(amount, "tokens"))
    shares = [
        cost / cap.max_cost_usd if cap.max_cost_usd else 0.0,
        tokens / cap.max_tokens if cap.max_tokens else 0.0,
    ]
    return SpendStatus(
        per=cap.per,
        model=model,
        period=window.id,
        resets_at=rfc3339(window.end),
        cost_usd=round(cost, 6),
        tokens=tokens,
        used=max(shares),
    )
