"""Rates a model's calls keep, paced by GCRA (the generic cell rate algorithm): a unit every
`60 / per_minute` seconds, and up to `burst` units at once after a quiet while, as the
providers' own token buckets let them through. A call takes its slot when it asks and waits for
it, so callers go in the order they asked without a queue to keep. Below the providers, which
pace a process's calls (`tether.providers.pace`), and the index, which paces a whole agent's
(`tether.programs.worker.pace`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """`per_minute` units a minute, `burst` of them at once (None: a minute's worth)."""

    per_minute: int
    burst: int | None = None

    def __post_init__(self) -> None:
        if self.per_minute < 1 or (self.burst is not None and self.burst < 1):
            raise ValueError(f"a rate needs units a minute and a burst of at least 1: {self}")

    @property
    def interval_ms(self) -> float:
        return 60_000 / self.per_minute

    def next_slot(self, last_ms: float, now_ms: float, cost: float = 1) -> tuple[float, float]:
        """How long a call of `cost` units that asks at `now_ms` waits, and the slot the next
        call's is counted from, given the one before (`last_ms`; 0: none yet). A call larger
        than the burst waits for the units past it."""
        burst = self.per_minute if self.burst is None else self.burst
        slot = max(last_ms, now_ms) + cost * self.interval_ms
        return max(0.0, slot - burst * self.interval_ms - now_ms), slot


@dataclass(frozen=True)
class Pace:
    """What a model's calls keep: `requests` a minute, and `input_tokens` a minute (a call's
    input estimated from its request). A call waits for the later of its two slots."""

    requests: Rate | None = None
    input_tokens: Rate | None = None

    def next_slots(
        self, last: Mapping[str, float], now_ms: float, tokens: int
    ) -> tuple[float, dict[str, float]]:
        """How long a call of `tokens` input tokens waits, and the slots of each rate after it,
        given those before (`last`, by rate: "requests", "input_tokens")."""
        wait, slots = 0.0, {}
        for unit, rate, cost in (
            ("requests", self.requests, 1),
            ("input_tokens", self.input_tokens, tokens),
        ):
            if rate is not None:
                unit_wait, slots[unit] = rate.next_slot(last.get(unit, 0.0), now_ms, cost)
                wait = max(wait, unit_wait)
        return wait, slots
