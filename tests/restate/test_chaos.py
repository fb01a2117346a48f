"""`make chaos` in short: 12 runs (plain, parked on an approval, fanning out to sub-agents, in
parallel, over budget) on a real local stack while a seeded killer SIGKILLs the worker,
restate-server and the sidecar for 20 s; nothing is lost or doubled (`tests.chaos`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos import scenario
from tests.chaos.__main__ import turns
from tests.chaos.local import LocalPlatform

SECONDS = 20.0
KILLS = ("worker", "restate", "sidecar")


def test_a_short_chaos_run_loses_and_doubles_nothing(tmp_path: Path) -> None:
    with LocalPlatform(turns(SECONDS), tmp_path) as platform:
        platform.kill_kinds = KILLS
        report = scenario.run_scenario(platform, runs=12, chaos_seconds=SECONDS, seed=3)
    print(report.summary())
    assert report.violations == []
    assert set(report.kills) == set(KILLS)
    assert report.statuses == {"completed": 10, "budget_exceeded": 2}
    assert report.children == 4 and report.approvals == 3


def test_the_checks_catch_a_body_that_ran_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same checks, on a ledger that says one body ran twice and another for no call."""
    with LocalPlatform(1, tmp_path) as platform:
        real = platform.ledger
        lines: list[str] = []

        def doubled() -> list[str]:
            lines[:] = real()
            return [*lines, lines[0], "no-such-session call_9_9 no-such-run"]

        monkeypatch.setattr(platform, "ledger", doubled)
        report = scenario.run_scenario(platform, runs=5, chaos_seconds=0, seed=3)
    session, call = lines[0].split()[:2]
    twice, in_session, unknown = report.violations
    assert twice == f"tool body ran 2 times: {session} {call}"
    assert in_session.startswith(f"{session}: record call {call} ran 2 times")
    assert unknown == "a tool body ran for a call no session knows: no-such-session call_9_9"
