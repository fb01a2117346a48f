"""The SQLite runtime under real SIGKILLs: at every step boundary and inside tool bodies."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tether.durable import journal_steps, run_status
from tether.messages import tool_uses
from tether.session import load_session, sqlite_store

PROGRAM = Path(__file__).parent / "programs" / "crash_agent.py"
UNSAFE = {"charge", "notify"}
ALL_CALLS = [f"call_{t}_{i}" for t, n in enumerate([1, 1, 3, 1, 2, 1, 1]) for i in range(n)]


def run_program(db: Path, effects: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROGRAM), str(db), str(effects), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )


def model_steps(db: Path) -> int:
    return sum(1 for _, _, kind, _ in journal_steps(db, "crash-run") if kind == "model")


def check_outcome(db: Path, effects: Path, resumed: dict[str, Any], models_before: int) -> None:
    assert resumed["status"] == "completed"
    assert run_status(db, "crash-run") == "completed"
    executions = Counter(line.split()[1] for line in effects.read_text().splitlines())
    tools = {line.split()[1]: line.split()[0] for line in effects.read_text().splitlines()}
    for call, count in executions.items():
        if tools[call] in UNSAFE:
            assert count == 1, f"unsafe {tools[call]} {call} ran {count} times"
    safe_calls = {c for c, t in tools.items() if t == "lookup"}
    assert safe_calls == {"call_1_0", "call_2_0", "call_2_1", "call_5_0"}
    # A model call whose step was committed is never made again.
    assert models_before + resumed["live"].get("model", 0) == 8
    session = asyncio.run(load_session(sqlite_store(db), "s"))
    assert session is not None
    turns = session.turns
    seen_calls: list[str] = []
    for i, turn in enumerate(turns):
        ids = [c["id"] for c in tool_uses(turn.content)] if turn.role == "assistant" else []
        if ids:
            results = [b["tool_use_id"] for b in turns[i + 1].content if b["type"] == "tool_result"]
            assert results == ids
            seen_calls += ids
    assert seen_calls == ALL_CALLS


def clean_run_commits(tmp_path: Path) -> int:
    """Commits of an uninterrupted run, counted by a run that never reaches its kill point."""
    db, effects = tmp_path / "count.db", tmp_path / "count.effects"
    done = run_program(db, effects, "--kill-after-commits", "100000")
    assert done.returncode == 0, done.stderr
    return len(journal_steps(db, "crash-run")) + 3  # + run status at open and close + flush


def test_a_clean_run_completes(tmp_path: Path) -> None:
    db, effects = tmp_path / "run.db", tmp_path / "effects"
    done = run_program(db, effects)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    assert stats["status"] == "completed"
    assert sum(stats["live"].values()) >= 20
    check_outcome(db, effects, stats, 0)


def test_kill_at_every_step_boundary(tmp_path: Path) -> None:
    boundaries = clean_run_commits(tmp_path)
    killed = 0
    for n in range(1, boundaries):
        db, effects = tmp_path / f"b{n}.db", tmp_path / f"b{n}.effects"
        effects.touch()
        crashed = run_program(db, effects, "--kill-after-commits", str(n))
        if crashed.returncode == 0:
            continue  # the run had fewer commits than n (the last boundaries)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr
        killed += 1
        models_before = model_steps(db)
        resumed = run_program(db, effects)
        assert resumed.returncode == 0, f"boundary {n}: {resumed.stderr}"
        check_outcome(db, effects, json.loads(resumed.stdout), models_before)
    assert killed >= 29  # a boundary per commit of the clean run (its answer ends it: no run:end)


@pytest.mark.parametrize("call", ALL_CALLS)
def test_kill_inside_a_tool_body(tmp_path: Path, call: str) -> None:
    db, effects = tmp_path / "t.db", tmp_path / "effects"
    crashed = run_program(db, effects, "--kill-in-call", call)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    models_before = model_steps(db)
    resumed = run_program(db, effects)
    assert resumed.returncode == 0, resumed.stderr
    stats = json.loads(resumed.stdout)
    check_outcome(db, effects, stats, models_before)
    lines = effects.read_text().splitlines()
    tool = next(line.split()[0] for line in lines if line.endswith(call))
    runs = sum(1 for line in lines if line.endswith(call))
    assert runs == (2 if tool == "lookup" else 1)
    session = asyncio.run(load_session(sqlite_store(db), "s"))
    assert session is not None
    result = next(
        b
        for t in session.turns
        for b in t.content
        if b["type"] == "tool_result" and b["tool_use_id"] == call
    )
    assert bool(result.get("is_error")) == (tool != "lookup")
