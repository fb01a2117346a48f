"""`tether.providers.Cooldown` on its own, with a clock the test moves."""

from __future__ import annotations

import pytest

from tether.providers import Cooldown
from tether.spec import ModelCooldown, parse_duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_model_is_skipped_only_after_its_failures_in_a_row() -> None:
    clock = Clock()
    cooldown = Cooldown(failures=3, seconds=30, clock=clock)
    cooldown.failed(0)
    cooldown.failed(0)
    cooldown.answered(0)  # an answer between them: the count starts again
    cooldown.failed(0)
    cooldown.failed(0)
    assert cooldown.skips(0) is None
    cooldown.failed(0)
    assert cooldown.skips(0) == 30
    assert cooldown.skips(1) is None  # each model on its own
    clock.now += 20
    assert cooldown.skips(0) == 10


def test_after_its_cooldown_one_call_tries_the_model_while_the_others_still_skip_it() -> None:
    clock = Clock()
    cooldown = Cooldown(failures=1, seconds=30, clock=clock)
    cooldown.failed(0)
    clock.now += 30
    assert cooldown.skips(0) is None  # this call tries it
    assert cooldown.skips(0) == 30  # the others wait for its outcome
    cooldown.failed(0)  # it failed again: one failure is enough to skip it again
    clock.now += 29
    assert cooldown.skips(0) == pytest.approx(1)
    clock.now += 1
    assert cooldown.skips(0) is None
    cooldown.answered(0)
    assert cooldown.skips(0) is None and cooldown.skips(0) is None


def test_a_trial_call_that_never_ends_lets_another_try_a_cooldown_later() -> None:
    clock = Clock()
    cooldown = Cooldown(failures=1, seconds=30, clock=clock)
    cooldown.failed(0)
    clock.now += 30
    assert cooldown.skips(0) is None  # hangs: no outcome
    clock.now += 30
    assert cooldown.skips(0) is None


def test_zero_seconds_never_skips() -> None:
    cooldown = Cooldown(failures=1, seconds=0)
    for _ in range(5):
        cooldown.failed(0)
    assert cooldown.skips(0) is None


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="failures must be at least 1"):
        Cooldown(failures=0)
    with pytest.raises(ValueError, match="seconds must not be negative"):
        Cooldown(seconds=-1)


def test_the_specs_default_cooldown_is_the_librarys() -> None:
    # Written twice: the spec (which the operator imports) sits below the providers.
    spec, library = ModelCooldown(), Cooldown()
    assert (spec.failures, parse_duration(spec.duration)) == (library.failures, library.seconds)
