"""Calendar periods (an hour, a day, a month) in UTC or in an IANA time zone, by which an agent's
spending is counted (`tether.spend_caps`) and shown (the operator's status)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, tzinfo
from typing import Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

Per = Literal["hour", "day", "month"]
PERIODS: tuple[Per, ...] = get_args(Per)
ZONE_MARK = "@"
"""Between a window's period and its zone in its id (`day:2026-12-07@Asia/Tokyo`); a UTC
window's id has none, as before there were zones."""


ZONE_PATTERN = r"^[A-Za-z][-+A-Za-z0-9_]*(/[-+A-Za-z0-9_]+)*$"
"""What an IANA time zone name looks like (for the CRD; `zone_problem` checks it is one)."""
_HOST_ZONES = ("localtime", "posixrules", "Factory", "posix/", "right/")
"""Names some systems' zone databases have beside the IANA ones, which mean the host's zone or
differ from host to host: a worker and the operator could read them differently."""


_UTC = ("UTC", "UCT", "Universal", "Zulu", "GMT", "GMT0", "GMT+0", "GMT-0", "Greenwich")
UTC_NAMES = frozenset(_UTC + tuple(f"Etc/{name}" for name in _UTC))
"""The names of UTC's clock (offset 0, never changed): a period in them is UTC's."""


def zone_problem(zone: str) -> str | None:
    """Why `zone` is not an IANA time zone name, or None."""
    try:
        if zone.startswith(_HOST_ZONES) or not re.fullmatch(ZONE_PATTERN, zone):
            raise ValueError(zone)
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a path
        return f"unknown time zone {zone!r}: expected an IANA name such as UTC or Europe/Paris"
    return None


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
        # UTC's windows, by any of its names, keep their ids of before zones.
        zone = None if zone in UTC_NAMES else zone
        at = datetime.fromtimestamp(t, UTC if zone is None else ZoneInfo(zone))
        if per == "hour":
            start_ts, end_ts = _hour(at, t)
            # In a zone, with its offset: the hour its clocks go back repeats on the clock.
            name = at.strftime("%Y-%m-%dT%H" if zone is None else "%Y-%m-%dT%H%z")
        elif per == "day":
            # fold=0: the first of two midnights, where the clocks go back over one
            start = at.replace(hour=0, minute=0, second=0, microsecond=0, fold=0)
            start_ts = start.timestamp()
            end_ts = _midnight(start.date() + timedelta(days=1), start.tzinfo)
            name = start.strftime("%Y-%m-%d")
        else:
            start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0, fold=0)
            start_ts = start.timestamp()
            first = start.date().replace(
                year=start.year + start.month // 12, month=start.month % 12 + 1
            )
            end_ts = _midnight(first, start.tzinfo)
            name = start.strftime("%Y-%m")
        if zone is not None:
            name = f"{name}{ZONE_MARK}{zone}"
        return cls(f"{per}:{name}", start_ts, end_ts)

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


def _hour(at: datetime, t: float) -> tuple[float, float]:
    """The bounds of the clock hour that holds `at` (at `t`): 3,600 s, cut where the zone's
    offset changes inside it (Lord Howe's clocks move by 30 minutes)."""
    start = round(t - (at.minute * 60 + at.second + at.microsecond / 1e6))  # whole seconds
    end = start + 3600
    offset = at.utcoffset()
    if _offset_at(start, at.tzinfo) != offset:  # the offset changed since the hour began
        start = _change(start, int(t), at.tzinfo)
    if _offset_at(end - 1, at.tzinfo) != offset:  # it changes before the hour ends
        end = _change(int(t), end - 1, at.tzinfo)
    return float(start), float(end)


def _offset_at(t: int, zone: tzinfo | None) -> timedelta | None:
    return datetime.fromtimestamp(t, zone).utcoffset()


def _change(before: int, after: int, zone: tzinfo | None) -> int:
    """The first second after `before` with `after`'s offset (one change between them)."""
    offset = _offset_at(after, zone)
    while after - before > 1:
        middle = (before + after) // 2
        if _offset_at(middle, zone) == offset:
            after = middle
        else:
            before = middle
    return after


def _midnight(day: date, zone: tzinfo | None) -> float:
    """The epoch seconds of `day`'s first moment in `zone`."""
    return datetime(day.year, day.month, day.day, tzinfo=zone).timestamp()
