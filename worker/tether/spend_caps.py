"""Caps on what all of an agent's runs spend together in a calendar hour, day or month (UTC, or
a time zone's).

A run's budget (`tether.budget`) bounds one run and its sub-agents; a cap bounds the agent: every
model call of every run, on every worker and version, first holds its worst case in the agent's
`SpendWindows`, and one that does not fit a cap does not start: `SpendCapReached` sends its run
to its next fallback model (whose call may fit), and from the last one ends the run with
`budget_exceeded`, or, under a cap that waits, has the run wait for the period to reset.
What a call spent counts in the hour, the day and the month it started in, whichever caps are
set, so versions with other caps share one count: in UTC, and in each time zone a version's
cap named since its count began; a call also counts for its model, which a cap of that model
alone (`SpendCap.model`) is held to: a model's cap refuses only its calls.
A hold that is never settled (its worker died mid-call, after the provider may have charged
it) counts as spent, at its worst case, after `HOLD_SECONDS`; a settle of a hold that is not
held counts nothing, and a settled hold is remembered while its reserve could be sent again.

Kept where an agent's calls meet: the index's `<agent>-spend` on Restate
(`tether.programs.worker.spend`), or a process's memory (`tether.providers.spend`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, get_args
from zoneinfo import ZoneInfo

from .budget import Limits, Spend
from .periods import PERIODS, UTC_NAMES, Per, Window, zone_problem

HOLD_SECONDS = 1800.0
"""How long a call's hold stands without a settle (longer than any model call may take); then
it counts as spent."""
REPLAYABLE_SECONDS = 120
"""How long after a hold was made a settled hold is remembered, so that its reserve sent again
makes no new one: as long as the reserve may stay fresh (a minute either side of its stamp, so
up to two after a hold made by a worker whose clock is ahead), and no longer, as they are kept
in the one state value meanwhile."""
OnReached = Literal["stop", "wait"]


@dataclass(frozen=True)
class SpendCap:
    """At most `limits` spent by the agent's calls in each calendar `per` (UTC, or in the IANA
    `time_zone`), or by those of one `model` (`provider/name`). A call that does not fit goes to
    the run's next fallback model, where there is one; from the last, it ends its run
    (`on_reached` stop), or the run waits for the next period."""

    per: Per
    limits: Limits
    on_reached: OnReached = "stop"
    model: str | None = None
    time_zone: str | None = None

    def __post_init__(self) -> None:
        if self.time_zone in UTC_NAMES:  # Etc/UTC's day is UTC's: one count, not two
            object.__setattr__(self, "time_zone", None)

    @property
    def label(self) -> str:
        """`day`, or `day:anthropic/claude-opus-4-1` for one model's: one cap per period and
        model. Names the sleep of a run waiting for it (`spend-cap:<turn>:<attempt>:<label>`)."""
        return self.per if self.model is None else f"{self.per}:{self.model}"

    def applies_to(self, model: str) -> bool:
        return self.model is None or self.model == model

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"per": self.per, **self.limits.to_json()}
        if self.on_reached != "stop":
            data["on_reached"] = self.on_reached
        if self.model is not None:
            data["model"] = self.model
        if self.time_zone is not None:
            data["time_zone"] = self.time_zone
        return data

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> SpendCap:
        per = data.get("per")
        if per not in PERIODS:
            raise ValueError(f"a spend cap is per hour, day or month, not {per!r}")
        limits = Limits.of(data)
        if not limits:
            raise ValueError("a spend cap needs cost_usd or tokens")
        on_reached = data.get("on_reached", "stop")
        if on_reached not in get_args(OnReached):
            raise ValueError(f"a spend cap stops or waits when reached, not {on_reached!r}")
        model = data.get("model")
        if model is not None and not (isinstance(model, str) and model):
            raise ValueError(f"a spend cap's model is a name, not {model!r}")
        zone = data.get("time_zone")
        if zone is not None and (problem := zone_problem(str(zone))) is not None:
            raise ValueError(f"a spend cap's time zone: {problem}")
        return cls(per, limits, on_reached, model, None if zone is None else str(zone))

    def window(self, t: float) -> Window:
        """The cap's period that holds `t`."""
        return Window.of(self.per, t, self.time_zone)

    def describe(self) -> str:
        amount = self.amount(Spend(self.limits.cost_usd or 0.0, self.limits.tokens or 0))
        on = "" if self.model is None else f" on {self.model}"
        return f"{amount}{on} {'an' if self.per == 'hour' else 'a'} {self.per} ({self.zone})"

    @property
    def zone(self) -> str:
        return self.time_zone or "UTC"

    @property
    def in_a_zone(self) -> bool:
        """Whether the cap's periods are another zone's than UTC's."""
        return self.zone != "UTC"

    def amount(self, spend: Spend) -> str:
        """`spend` in the units the cap sets."""
        amounts = []
        if self.limits.cost_usd is not None:
            amounts.append(f"${spend.cost_usd:.4g}")
        if self.limits.tokens is not None:
            amounts.append(f"{spend.tokens:,} tokens")
        return " and ".join(amounts)


@dataclass(frozen=True)
class Refusal:
    """Why a call may not start at `at`: the cap it would pass, and what its window holds.
    `waits`: its run waits for the window to end, then asks again."""

    cap: SpendCap
    window: Window
    spent: Spend
    held: Spend
    at: float
    waits: bool = False

    @property
    def wait_seconds(self) -> float:
        """How long until the window ends, by the clock of whoever keeps the caps."""
        return max(0.0, self.window.end - self.at)

    def message(self) -> str:
        cap = self.cap
        resets = datetime.fromtimestamp(self.window.end, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if cap.in_a_zone:  # the zone's clock too: when the people it is for see it
            local = datetime.fromtimestamp(self.window.end, ZoneInfo(cap.zone))
            resets = f"{local.isoformat(timespec='seconds')} ({resets})"
        then = (
            f"the run waits until it resets at {resets}" if self.waits else f"it resets at {resets}"
        )
        whose = "runs" if cap.model is None else f"runs' calls to {cap.model}"
        return (
            f"the agent's spend cap of {cap.describe()} is reached: this {cap.per} its "
            f"{whose} spent {cap.amount(self.spent)}, and calls in flight hold "
            f"{cap.amount(self.held)} more; {then}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cap": self.cap.to_json(),
            "window": [self.window.id, self.window.start, self.window.end],
            "spent": self.spent.to_json(),
            "held": self.held.to_json(),
            "at": self.at,
            "waits": self.waits,
        }

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Refusal:
        window_id, start, end = data["window"]
        return cls(
            SpendCap.of(data["cap"]),
            Window(str(window_id), float(start), float(end)),
            Spend.of(data["spent"]),
            Spend.of(data["held"]),
            float(data["at"]),
            bool(data.get("waits")),
        )


@dataclass(frozen=True)
class _Hold:
    ask: Spend
    at: float
    model: str = ""
    zones: tuple[str, ...] = ()
    """The time zones counted in when the call was held (its version's caps', and those counted
    in already): its windows there count it."""


@dataclass
class SpendWindows:
    """What an agent's calls spent in each current window, and what its calls in flight hold."""

    spent: dict[str, Spend] = field(default_factory=dict)
    held: dict[str, _Hold] = field(default_factory=dict)
    settled: dict[str, int] = field(default_factory=dict)
    """Settled holds, until when their reserve might be sent again."""

    def reserve(
        self, caps: Iterable[SpendCap], hold: str, ask: Spend, now: float, model: str = ""
    ) -> Refusal | None:
        """Hold `ask` for the call `hold` to `model` if it fits every cap of the agent and of
        the model at `now`; why not otherwise: the agent's caps first, and of those that
        refuse, one that stops, else one that waits, each the one whose period ends last (the
        others' end before). A hold already made or settled is granted again without a new
        one."""
        self._prune(now)
        if hold in self.held or hold in self.settled:
            return None
        caps = list(caps)
        refusals = []
        for cap in caps:
            if not cap.applies_to(model):
                continue
            window = cap.window(now)
            spent = self.spent.get(window.key(cap.model), Spend())
            held = self._held_in(window, cap.model)
            if cap.limits.exceeded_by(spent + held + ask):
                # Waiting helps only a call that fits the cap in a period of its own.
                waits = cap.on_reached == "wait" and not cap.limits.exceeded_by(ask)
                refusals.append(Refusal(cap, window, spent, held, now, waits))
        if refusals:
            refusals = [r for r in refusals if r.cap.model is None] or refusals
            stops = [r for r in refusals if not r.waits]
            return max(stops or refusals, key=lambda r: r.window.end)
        # Its caps' zones, and every zone counted in already: versions of other zones, or of
        # none, keep each zone's count whole from when a version first named it.
        zones = {cap.zone for cap in caps if cap.in_a_zone} | self._named_zones()
        self.held[hold] = _Hold(ask, now, model, tuple(sorted(zones)))
        return None

    def settle(self, hold: str, actual: Spend, now: float | None = None) -> None:
        """The call `hold` spent `actual`: counted in the windows it started in, once. One not
        held (its reserve lost on its way, or not yet come) is remembered at `now`, so that its
        reserve, if it comes after all, holds nothing."""
        made = self.held.pop(hold, None)
        if made is None:  # settled before, or counted at its worst case already
            if now is not None and hold not in self.settled:
                self.settled[hold] = math.ceil(now + REPLAYABLE_SECONDS)
            return
        self.settled[hold] = math.ceil(made.at + REPLAYABLE_SECONDS)
        self._count(made, actual)

    def _count(self, made: _Hold, spent: Spend) -> None:
        """What the call of the hold `made` spent, in the windows it started in: the agent's,
        and its model's."""
        # Each once: a hold of a version before UTC's other names were UTC's may name Etc/UTC.
        zones = (None, *made.zones)
        windows = dict.fromkeys(Window.of(per, made.at, zone) for zone in zones for per in PERIODS)
        for window in windows:
            for key in (window.id, window.key(made.model)) if made.model else (window.id,):
                self.spent[key] = self.spent.get(key, Spend()) + spent

    def windows(self, now: float) -> list[dict[str, Any]]:
        """Each current window, in UTC and in each time zone counted in: what was spent in it
        and what calls in flight hold, and what each model's calls spent."""
        self._prune(now)
        keys = {key: Window.split_key(key) for key in self.spent}
        shown = []
        for window in (Window.of(per, now, zone) for zone in self._zones() for per in PERIODS):
            models = {
                model: self.spent[key].to_json()
                for key, (of, model) in keys.items()
                if of == window.id and model is not None
            }
            shown.append(
                {
                    "window": window.id,
                    "spent": self.spent.get(window.id, Spend()).to_json(),
                    "held": self._held_in(window).to_json(),
                    **({"models": models} if models else {}),
                }
            )
        return shown

    def _held_in(self, window: Window, model: str | None = None) -> Spend:
        """What the calls in flight that started in `window` hold: all of them, or `model`'s."""
        return sum(
            (
                h.ask
                for h in self.held.values()
                if window.start <= h.at < window.end and model in (None, h.model)
            ),
            Spend(),
        )

    def _prune(self, now: float) -> None:
        for hold in [k for k, h in self.held.items() if now - h.at >= HOLD_SECONDS]:
            # Never settled: the call may have been charged, so its worst case is what it cost.
            made = self.held.pop(hold)
            self._count(made, made.ask)
        self.settled = {k: until for k, until in self.settled.items() if now < until}
        zones = self._zones()
        current = {Window.of(per, now, zone).id for zone in zones for per in PERIODS}
        current |= {
            Window.of(per, h.at, zone).id
            for h in self.held.values()
            for zone in zones
            for per in PERIODS
        }
        # A model's count (`day:2026-12-06 openai/gpt-5`) goes with its window's.
        self.spent = {k: v for k, v in self.spent.items() if Window.split_key(k)[0] in current}

    def _zones(self) -> list[str | None]:
        """UTC (None), and each time zone counted in or held for."""
        return [None, *sorted(self._named_zones())]

    def _named_zones(self) -> set[str]:
        named = {Window.zone_of(Window.split_key(key)[0]) for key in self.spent}
        named |= {zone for h in self.held.values() for zone in h.zones}
        return {zone for zone in named if zone is not None}

    def to_json(self) -> dict[str, Any]:
        return {
            "spent": {k: v.to_json() for k, v in self.spent.items()},
            "held": {
                k: {
                    **h.ask.to_json(),
                    "at": h.at,
                    **({"model": h.model} if h.model else {}),
                    **({"zones": list(h.zones)} if h.zones else {}),
                }
                for k, h in self.held.items()
            },
            "settled": self.settled,
        }

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> SpendWindows:
        data = data or {}
        return cls(
            spent={k: Spend.of(v) for k, v in (data.get("spent") or {}).items()},
            held={
                k: _Hold(
                    Spend.of(v),
                    float(v["at"]),
                    str(v.get("model") or ""),
                    tuple(str(zone) for zone in v.get("zones") or ()),
                )
                for k, v in (data.get("held") or {}).items()
            },
            settled={k: int(t) for k, t in (data.get("settled") or {}).items()},
        )
