"""A rate of calls, paced by GCRA (the generic cell rate algorithm): calls go `60 / per_minute`
seconds apart, and up to `burst` of them at once after a quiet while, as the providers' own
token buckets let them. A call takes its slot when it asks and waits for it, so callers go in
the order they asked without a queue to keep. Below the providers, which pace a process's calls
(`tether.providers.pace`), and the index, which paces a whole agent's
(`tether.programs.worker.pace`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rate:
    """`per_minute` calls a minute, `burst` of them at once (None: a minute's worth)."""

    per_minute: int
    burst: int | None = None

    def __post_init__(self) -> None:
        if self.per_minute < 1 or (self.burst is not None and self.burst < 1):
            raise ValueError(f"a rate needs calls a minute and a burst of at least 1: {self}")

    @property
    def interval_ms(self) -> float:
        return 60_000 / self.per_minute

    def next_slot(self, last_ms: float, now_ms: float) -> tuple[float, float]:
        """How long a call that asks at `now_ms` waits, and the slot that the next call's is
        counted from, given the one before (`last_ms`; 0: none yet)."""
        burst = self.per_minute if self.burst is None else self.burst
        slot = max(last_ms, now_ms)
        return max(0.0, slot - (burst - 1) * self.interval_ms - now_ms), slot + self.interval_ms
