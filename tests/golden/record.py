"""Records golden databases: what this Tether leaves in a user's SQLite file when a run stops
part-way, kept as SQL text for `tests/test_golden_journals.py`, which resumes every one of them
with the code of the day.

    .venv/bin/python -m tests.golden.record [--date YYYY-MM-DD]

A golden is a database a released Tether wrote, so one is never edited or recorded again: a
change that cannot resume it needs a migration (`tether._sqlite.SCHEMA_VERSION`) or a replay
that still reads its steps. When the journal's shape changes on purpose, record anew: the new
files go beside the old ones (named by the day), and both kinds must keep resuming. Each recipe
writes `<day>-<recipe>.sql` and whatever its test needs beside it; existing files are kept.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import signal
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.test_answers import SHIP, run, write_agent
from tests.test_cli import runs_db
from tests.test_sqlite_crash_matrix import run_program

HERE = Path(__file__).resolve().parent
KILLED_IN_CALL = "call_2_2"
"""The unsafe `notify` of the turn that runs three calls at once (`tests/programs/errands.py`)."""


def killed_in_an_unsafe_call(work: Path, out: Path) -> Path:
    """`crash_agent.py` killed inside an unsafe body, after its effect: its intent is journaled,
    its result is not. Beside the dump, the effects the tools had written (`.effects`)."""
    db, effects = work / "run.db", work / "effects"
    effects.touch()
    crashed = run_program(db, effects, "--kill-in-call", KILLED_IN_CALL)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    shutil.copy(effects, out.with_suffix(".effects"))
    return db


def parked_for_an_approval(work: Path, out: Path) -> Path:
    """`tether run` of a spec whose tool needs an approval, parked (exit 3) until a person
    answers. Beside the dump, the spec (`.yaml`)."""
    spec = write_agent(work, [{"tool_calls": [SHIP]}, {"text": "shipped"}])
    parked = run(work, "--prompt", "ship it")
    assert parked.returncode == 3, parked.stdout + parked.stderr
    shutil.copy(spec, out.with_suffix(".yaml"))
    return runs_db(work)


SPAWN = {"name": "spawn", "input": {"task": "do the ship"}}
SUB_AGENT_SCRIPT = {
    "ship it": [{"tool_calls": [SPAWN]}, {"text": "done"}],
    "do the ship": [{"tool_calls": [SHIP]}, {"text": "child shipped"}],
}


def sub_agent_parked_under_a_budget(work: Path, out: Path) -> Path:
    """`tether run` whose sub-agent (the in-process spawn tool) waits for an approval, the run
    under a token budget: the child's steps in the parent's journal, the budget's ledger."""
    spec = write_agent(work, [])
    document = yaml.safe_load(spec.read_text())
    document["spec"]["model"]["script"] = SUB_AGENT_SCRIPT
    document["spec"]["subagents"] = {"maxDepth": 1}
    document["spec"]["limits"] = {"maxTokens": 10_000}
    spec.write_text(yaml.safe_dump(document))
    parked = run(work, "--prompt", "ship it")
    assert parked.returncode == 3, parked.stdout + parked.stderr
    shutil.copy(spec, out.with_suffix(".yaml"))
    return runs_db(work)


RECIPES: dict[str, Callable[[Path, Path], Path]] = {
    "killed-in-an-unsafe-call": killed_in_an_unsafe_call,
    "parked-for-an-approval": parked_for_an_approval,
    "sub-agent-parked-under-a-budget": sub_agent_parked_under_a_budget,
}


def dump(db: Path, out: Path, recipe: str) -> None:
    commit = subprocess.run(  # "-dirty": by the commit's code with changes not yet committed
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()
    with sqlite3.connect(db) as conn:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        lines = list(conn.iterdump())
    header = [
        f"-- {recipe}: recorded by `python -m tests.golden.record` at {commit or '?'}. "
        "Never edit it.",
        f"PRAGMA user_version = {version};",
    ]
    out.write_text("\n".join([*header, *lines]) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    args = parser.parse_args()
    for recipe, make in RECIPES.items():
        out = HERE / f"{args.date}-{recipe}.sql"
        if out.exists():
            print(f"kept {out.name}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "work"
            work.mkdir()
            dump(make(work, out), out, recipe)
        print(f"recorded {out.name}")


if __name__ == "__main__":
    main()
