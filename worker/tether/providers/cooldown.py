"""Cooldown: a model that keeps failing is skipped for a while, so that a turn does not wait
on a model that is down (up to its timeout) before its fallback answers."""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_FAILURES = 3  # `tether.spec.ModelCooldown` too (tests/test_cooldown.py holds them equal)
DEFAULT_SECONDS = 30.0


class Cooldown:
    """After `failures` failed calls in a row that say the model is unavailable (a rate limit,
    an overload, a 5xx, a timeout: the retryable errors), a model is skipped for `seconds`: the
    turns that would ask it go straight to the next of the agent's fallbacks. Then one call
    tries it again, while the others still skip it: an answer ends its cooldown, a failure
    starts another. The agent's last model is always asked.

    A skip is journaled as the model step's value, so a replay skips what the live run
    skipped whatever this object holds. One Cooldown serves one list of models, indexed as
    the agent holds them (0: its provider, then its fallbacks): an agent's runs, its
    sub-agents', every run of a worker. It lives in this process: each replica learns on its
    own. `seconds=0` turns it off."""

    def __init__(
        self,
        failures: int = DEFAULT_FAILURES,
        seconds: float = DEFAULT_SECONDS,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failures < 1:
            raise ValueError(f"failures must be at least 1, not {failures}")
        if seconds < 0:
            raise ValueError(f"seconds must not be negative, not {seconds}")
        self.failures = failures
        self.seconds = seconds
        self._clock = clock
        self._failed: dict[int, int] = {}
        self._until: dict[int, float] = {}

    def skips(self, model: int) -> float | None:
        """The seconds left in `model`'s cooldown if a call to it should be skipped; None: ask
        it. The first call after a cooldown asks it, and the others skip it for another
        `seconds` or until that call's outcome is known."""
        until = self._until.get(model)
        if until is None:
            return None
        now = self._clock()
        if now < until:
            return until - now
        self._until[model] = now + self.seconds  # this call tries it for the others
        return None

    def failed(self, model: int) -> None:
        """A call to `model` failed as unavailable."""
        failed = self._failed[model] = self._failed.get(model, 0) + 1
        if self.seconds and failed >= self.failures:
            self._until[model] = self._clock() + self.seconds

    def answered(self, model: int) -> None:
        """`model` answered a call: its count of failures starts again."""
        self._failed.pop(model, None)
        self._until.pop(model, None)
