"""The budget ledger's metrics: a process releases only the holds it took."""

from __future__ import annotations

from prometheus_client import REGISTRY

from tether.budget import Spend
from tether.programs.metrics import budget_observer

AGENT = "metrics-budget"


def held(unit: str) -> float:
    value = REGISTRY.get_sample_value("tether_budget_held", {"agent": AGENT, "unit": unit})
    return value or 0.0


def test_a_hold_is_released_only_by_the_process_that_took_it() -> None:
    first, replacement = budget_observer(AGENT), budget_observer(AGENT)
    first("held", "r/model:0:0", Spend(0.1, 1000))
    first("held", "r/model:0:0", Spend(0.1, 1000))  # the handler retried: held once
    assert (held("usd"), held("tokens")) == (0.1, 1000)
    # A worker that did not take the hold (its taker was killed and left the sum) settles it.
    replacement("released", "r/model:0:0", Spend(0.1, 1000))
    replacement("spent", "r/model:0:0", Spend(0.05, 600))
    assert (held("usd"), held("tokens")) == (0.1, 1000)
    first("released", "r/model:0:0", Spend(0.1, 1000))
    assert (held("usd"), held("tokens")) == (0.0, 0)
    spent = REGISTRY.get_sample_value("tether_budget_spent_total", {"agent": AGENT, "unit": "usd"})
    assert spent == 0.05
    replacement("denied", "r/model:1:0", Spend(0.1, 1000))
    assert REGISTRY.get_sample_value("tether_budget_denied_total", {"agent": AGENT}) == 1
