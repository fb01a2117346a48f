"""The operator's view of a spend cap from `<agent>-spend/all`'s state: what was spent in its
current period and how many runs a cap that waits holds back (status and gauges)."""

from __future__ import annotations

import time

from tether.budget import Limits, Spend
from tether.spec import SpendCapSpec
from tether.spend_caps import SpendCap, SpendWindows
from tether_operator import metrics
from tether_operator.spend import status_of


def test_a_cap_that_waits_shows_the_runs_it_holds_back() -> None:
    now = time.time()
    windows = SpendWindows()
    cap = SpendCap("day", Limits(tokens=1_000), on_reached="wait")
    assert windows.reserve([cap], "a", Spend(0, 900), now) is None
    windows.settle("a", Spend(0, 900))
    for hold in ("b", "c"):
        assert windows.reserve([cap], hold, Spend(0, 200), now) is not None
    state = windows.to_json()  # as the admin API reads it
    spec = SpendCapSpec.model_validate({"per": "day", "maxTokens": 1_000, "onReached": "wait"})
    status = status_of(spec, None, now, state)
    assert (status.tokens, status.used, status.waiting) == (900, 0.9, 2)
    assert status.model_dump(by_alias=True, exclude_defaults=True)["waiting"] == 2

    shown: set[tuple[str, str]] = set()
    metrics.report_spend("ns", "thrifty", [status], shown)
    labels = {"namespace": "ns", "agent": "thrifty", "period": "day", "model": ""}
    sample = metrics.REGISTRY.get_sample_value
    assert sample("tether_spend_cap_waiting_runs", labels) == 2
    assert sample("tether_spend_cap_used_ratio", labels) == 0.9
    metrics.report_spend("ns", "thrifty", [], shown)  # the cap dropped: its gauges go
    assert sample("tether_spend_cap_waiting_runs", labels) is None
