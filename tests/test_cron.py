"""When a schedule's runs are due (`tether.cron`)."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from tether.cron import Cron

PARIS = ZoneInfo("Europe/Paris")


def at(*fields: int, zone: ZoneInfo = PARIS) -> float:
    return datetime(*fields, tzinfo=zone).timestamp()


def test_times_are_read_in_the_schedules_zone_across_a_change_of_clocks() -> None:
    standup = Cron("30 9 * * 1-5", "Europe/Paris")
    # The Friday before the clocks go back (October 25th): next is Monday at 9:30 in Paris,
    # three days and an hour later.
    friday = at(2026, 10, 23, 9, 30)
    assert standup.next_after(friday) == at(2026, 10, 26, 9, 30)
    assert at(2026, 10, 26, 9, 30) - friday == 3 * 86400 + 3600
    assert standup.next_after(friday - 1) == friday  # strictly after
    assert standup.last_due(friday) == friday  # at or before
    assert standup.last_due(at(2026, 10, 25, 12, 0)) == friday  # the weekend: Friday's


def test_a_late_tick_finds_the_latest_time_due() -> None:
    hourly = Cron("@hourly")
    noon = at(2026, 12, 6, 12, 0, zone=ZoneInfo("UTC"))
    assert hourly.last_due(noon + 3 * 3600 + 59) == noon + 3 * 3600


def test_six_fields_have_seconds_first() -> None:
    every_2s = Cron("*/2 * * * * *")
    t = at(2026, 12, 6, 12, 0, zone=ZoneInfo("UTC"))
    assert [every_2s.next_after(t + d) for d in (0, 0.5, 1, 2)] == [t + 2, t + 2, t + 2, t + 4]


@pytest.mark.parametrize(
    ("expression", "zone", "says"),
    [
        ("* * *", "UTC", "not a cron expression"),
        ("0 0 31 4 *", "UTC", "never due"),
        ("@daily", "Nowhere/Else", "unknown time zone"),
    ],
)
def test_an_expression_that_names_no_time_is_refused(expression: str, zone: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Cron(expression, zone)
