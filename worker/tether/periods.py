"""Calendar periods (an hour, a day, a month) in UTC or in an IANA time zone, by which an agent's
spending is counted (`tether.spend_caps`) and shown (the operator's status)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

Per = Literal["hour", "day", "month"]
PERIODS: tuple[Per, ...] = get_args(Per)
ZONE_MARK = "@"
"""Between a window's period and its zone in its id (`day:2026-12-07@Asia/Tokyo`); a UTC
window's id has none, as before there were zones."""


def zone_problem(zone: str) -> str | None:
    """Why `zone` is not an IANA time zone name, or None."""
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a path
        return f"unknown time zone {zone!r}: expected an IANA name such as UTC or Europe/Paris"
    return None


def _zone(zone: str | None) -> tzinfo:
    return UTC if zone in (None, "UTC") else ZoneInfo(zone)


@dataclass(frozen=True)
class Window:
    """One calendar period: its id (`day:2026-12-06`, or `day:2026-12-07@Asia/Tokyo` in a zone)
    and its bounds (epoch seconds). A day is 23 or 25 hours long where the zone's clocks change."""

    id: str
    start: float
    end: float

    @classmethod
    def of(cls, per: Per, t: float, zone: str | None = None) -> Window:
        """The `per` that holds `t` in `zone` (None: UTC)."""
        at = datetime.fromtimestamp(t, _zone(zone))
        if per == "hour":
            start = at.replace(minute=0, second=0, microsecond=0)
            # An hour is 3,600 s wherever the clocks change: the next one starts then.
            end_ts = start.timestamp() + 3600
            # In a zone, with its offset: the hour its clocks go back repeats on the clock.
            name = start.strftime("%Y-%m-%dT%H" if zone in (None, "UTC") else "%Y-%m-%dT%H%z")
        elif per == "day":
            start = at.replace(hour=0, minute=0, second=0, microsecond=0)
            end_ts = _midnight(start.date() + timedelta(days=1), start.tzinfo)
            name = start.strftime("%Y-%m-%d")
        else:
            start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            first = start.date().replace(
                year=start.year + start.month // 12, month=start.month % 12 + 1
            )
            end_ts = _midnight(first, start.tzinfo)
            name = start.strftime("%Y-%m")
        if zone not in (None, "UTC"):
            name = f"{name}{ZONE_MARK}{zone}"
        return cls(f"{per}:{name}", start.timestamp(), end_ts)

    @staticmethod
    def zone_of(window_id: str) -> str | None:
        """The time zone of the window `window_id` (None: UTC)."""
        _, mark, zone = window_id.partition(ZONE_MARK)
        return zone if mark else None

    def key(self, model: str | None = None) -> str:
        """Where what was spent in this window is counted: all of the agent's calls (None), or
        those of one model (`provider/name`)."""
        return self.id if model is None else f"{self.id} {model}"

    @staticmethod
    def split_key(key: str) -> tuple[str, str | None]:
        """The window's id and the model (None: all of the agent's calls) of a `key`."""
        window, _, model = key.partition(" ")
        return window, model or None


def _midnight(day: date, zone: tzinfo | None) -> float:
    """The epoch seconds of `day`'s first moment in `zone`."""
    return datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()
