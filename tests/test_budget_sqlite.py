"""One budget for a run and its sub-agents on the SQLite runtime, under real SIGKILLs after every
commit: a resumed run never spends past its budget, never holds a call twice, and settles every
call it journaled. Before the ledger, the second child got "what is left" ($0.15) and spent
$0.20 of it: $0.70 of $0.65."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PROGRAM = Path(__file__).parent / "programs" / "budget_agent.py"
BUDGET = 0.65
SPENT = 0.60
"""Six calls of $0.10: the root's two spawns and the first child's four; nothing more fits."""
CALLS = 8
"""The model steps journaled: the six, the second child's first (denied) and the root's last."""


def run(db: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), str(db), *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROGRAM.parent,
    )


def check(outcome: dict[str, Any]) -> None:
    assert outcome["status"] == "budget_exceeded"
    assert outcome["children"] == ["completed", "budget_exceeded"]
    ledger = outcome["ledger"]
    assert ledger["limits"]["cost_usd"] == BUDGET
    assert ledger["spent"]["cost_usd"] == pytest.approx(SPENT)
    assert ledger["spent"]["cost_usd"] <= BUDGET
    assert ledger["held"] == {} and ledger["settled"] == CALLS
    assert outcome["cost_usd"] == pytest.approx(SPENT)


def test_a_run_and_its_children_stay_within_one_budget(tmp_path: Path) -> None:
    done = run(tmp_path / "run.db")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    check(outcome)
    assert outcome["live_model_calls"] == 6  # the denied ones never reached the model


def test_a_kill_after_any_commit_never_spends_past_the_budget(tmp_path: Path) -> None:
    # Every third commit (steps, sessions and ledger rows commit alike), to the end of the run:
    # the kill point past the last commit lets the run finish.
    kills = 0
    for kill_at in itertools.count(1, 3):
        db = tmp_path / f"kill-{kill_at}.db"
        first = run(db, "--kill-after-commits", str(kill_at))
        if first.returncode == 0:
            check(json.loads(first.stdout))
            break
        assert first.returncode == -signal.SIGKILL, (kill_at, first.stderr)
        kills += 1
        resumed = run(db)
        assert resumed.returncode == 0, (kill_at, resumed.stderr)
        check(json.loads(resumed.stdout))
    assert kills > 10, kills
