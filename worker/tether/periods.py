"""Calendar periods in UTC (an hour, a day, a month), by which an agent's spending is counted
(`tether.spend_caps`) and shown (the operator's status)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal, get_args

Per = Literal["hour", "day", "month"]
PERIODS: tuple[Per, ...] = get_args(Per)


@dataclass(frozen=True)
class Window:
    """One calendar period in UTC: its id (`day:2026-12-06`) and its bounds (epoch seconds)."""

    id: str
    start: float
    end: float

    @classmethod
    def of(cls, per: Per, t: float) -> Window:
        at = datetime.fromtimestamp(t, UTC)
        if per == "hour":
            start = at.replace(minute=0, second=0, microsecond=0)
            end_ts = start.timestamp() + 3600
            name = start.strftime("%Y-%m-%dT%H")
        elif per == "day":
            start = at.replace(hour=0, minute=0, second=0, microsecond=0)
            end_ts = start.timestamp() + 86400
            name = start.strftime("%Y-%m-%d")
        else:
            start = at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            after = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
            end_ts = after.timestamp()
            name = start.strftime("%Y-%m")
        return cls(f"{per}:{name}", start.timestamp(), end_ts)

    def key(self, model: str | None = None) -> str:
        """Where what was spent in this window is counted: all of the agent's calls (None), or
        those of one model (`provider/name`)."""
        return self.id if model is None else f"{self.id} {model}"

    @staticmethod
    def split_key(key: str) -> tuple[str, str | None]:
        """The window's id and the model (None: all of the agent's calls) of a `key`."""
        window, _, model = key.partition(" ")
        return window, model or None
