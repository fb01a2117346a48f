"""Cron times: when a schedule's runs are due (`spec.schedules`), in its time zone. Below the
spec, which checks an expression, and the index, whose `<agent>-schedule` object starts the runs
(`tether.programs.worker.schedule`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import CroniterError, croniter

from .periods import zone_problem

EXPRESSION_HELP = (
    "five fields (minute hour day-of-month month day-of-week), six with seconds first, or a "
    "shorthand (@hourly, @daily, @weekly, @monthly, @yearly)"
)


@dataclass(frozen=True)
class Cron:
    """A cron expression read in the time zone `zone` (an IANA name such as Europe/Paris)."""

    expression: str
    zone: str = "UTC"

    def __post_init__(self) -> None:
        problem = cron_problem(self.expression, self.zone)
        if problem is not None:
            raise ValueError(problem)

    def next_after(self, t: float) -> float:
        """The first time due strictly after `t` (epoch seconds)."""
        return float(self._iter(t).get_next(float))

    def last_due(self, t: float) -> float:
        """The latest time due at or before `t`."""
        later = self._iter(t).get_next(float)
        return float(self._iter(later).get_prev(float))

    def _iter(self, t: float) -> croniter:
        start = datetime.fromtimestamp(t, ZoneInfo(self.zone))
        return croniter(self.expression, start, second_at_beginning=_has_seconds(self.expression))


def cron_problem(expression: str, zone: str) -> str | None:
    """Why `expression` in `zone` names no times, or None."""
    if (problem := zone_problem(zone)) is not None:
        return problem
    if not croniter.is_valid(expression, second_at_beginning=_has_seconds(expression)):
        return f"not a cron expression: {expression!r}; expected {EXPRESSION_HELP}"
    try:
        croniter(
            expression, datetime.now(ZoneInfo(zone)), second_at_beginning=_has_seconds(expression)
        ).get_next()
    except CroniterError:  # valid fields that never meet (February 30th)
        return f"the cron expression {expression!r} is never due"
    return None


def _has_seconds(expression: str) -> bool:
    return len(expression.split()) == 6
