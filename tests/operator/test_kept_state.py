"""The status the operator shows of an agent's schedules and spend caps, read from their Restate
state (`<agent>-schedule/<name>`, `<agent>-spend/all`)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tether.periods import Window
from tether.spec import ScheduleStatus, SpendCapSpec
from tether_operator.restate_admin import RestateObserver
from tether_operator.schedules import _as_kept
from tether_operator.spend import _status

CAP = SpendCapSpec.model_validate({"per": "day", "maxTokens": 1_000, "maxCostUsd": 2.0})


def counted(amount: Any) -> dict[str, Any]:
    return {Window.of("day", time.time(), None).key(None): amount}


def test_a_count_shows_its_share_of_the_cap() -> None:
    status = _status(CAP, None, time.time(), counted({"tokens": 250, "cost_usd": 1.5}))
    assert (status.tokens, status.cost_usd, status.used) == (250, 1.5, 0.75)


@pytest.mark.parametrize(
    "spent",
    [
        ["not", "an", "object"],
        "spent",
        counted(["tokens", 5]),
        counted({"tokens": "many", "cost_usd": "1.5"}),
        counted({"tokens": True, "cost_usd": None}),
        counted({"tokens": -40, "cost_usd": float("nan")}),
        counted({"tokens": 1e400, "cost_usd": {"usd": 1}}),
        counted({"tokens": 10**400, "cost_usd": 1e300}),
    ],
    ids=[
        "list",
        "string",
        "amount-list",
        "strings",
        "bool-null",
        "negative-nan",
        "inf-object",
        "huge",
    ],
)
def test_a_hand_edited_count_shows_nothing_spent_instead_of_failing(spent: Any) -> None:
    # Only the agent's signed handlers write it, but the admin API lets anyone with its port
    # rewrite it: the status pass of every agent must go on.
    status = _status(CAP, None, time.time(), spent)
    assert (status.tokens, status.cost_usd, status.used) == (0, 0.0, 0.0)


def test_a_schedule_shows_its_runs() -> None:
    kept = {"next": 1_800_000_000, "last": 1_799_996_400.5, "session": "s-1", "late": 2}
    status = _as_kept(ScheduleStatus(name="nightly", hash="h"), kept)
    assert (status.next_run, status.last_run) == ("2027-01-15T08:00:00Z", "2027-01-15T07:00:00Z")
    assert (status.last_session, status.late_ticks) == ("s-1", 2)


@pytest.mark.parametrize(
    "kept",
    [
        {"next": "tomorrow", "last": [1], "session": 7, "late": "x"},
        {"next": 1e20, "last": float("inf"), "session": {"id": "s"}, "late": -3},
        {"next": True, "last": None, "session": None, "late": float("nan")},
        {"next": -5e10, "last": -1, "session": None, "late": 10**400},
        {"next": 2.0**60, "last": 253_402_300_800, "session": None, "late": 1e300},
    ],
    ids=["strings", "out-of-range", "bool-nan", "before-1970", "huge"],
)
def test_a_hand_edited_schedule_shows_nothing_instead_of_failing(kept: dict[str, Any]) -> None:
    status = _as_kept(ScheduleStatus(name="nightly", hash="h"), kept)
    assert (status.next_run, status.last_run, status.last_session, status.late_ticks) == (
        None,
        None,
        None,
        0,
    )


async def test_a_value_nested_past_the_parser_is_left_out_not_every_agents_pass() -> None:
    # One row of one agent's state, shared by every agent's pass through the cached query.
    nested = "[" * 100_000
    rows = {
        "parked": [
            {"service": "a-parked", "value": nested},
            {"service": "b-parked", "value": "{}"},
        ],
        "spend": [
            {"service": "a-spend", "name": "all", "value": nested},
            {"service": "b-spend", "name": "all", "value": '{"spent": {}}'},
        ],
    }

    class Admin:
        async def query(self, sql: str) -> list[dict[str, Any]]:
            return rows["parked" if "parked" in sql else "spend"]

    observer = RestateObserver(Admin(), 0.0, 0.0)  # type: ignore[arg-type]
    assert await observer.parked_calls("b-parked") == 0
    assert await observer.spend("b-spend") == {"spent": {}}
    assert await observer.spend("a-spend") == {}
