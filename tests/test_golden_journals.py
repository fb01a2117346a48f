"""Runs an earlier Tether left in a SQLite file resume on this one: a run killed part-way, a run
parked for a week's wait for a person's approval, answer or more budget, a sub-agent parked under
a budget, a run parked after its fallback model answered, a run of an agent with an output.
Each golden (`tests/golden/`, see its `record.py`) is a database as a released version wrote it,
loaded into a fresh file and resumed by real processes; and a database a newer Tether wrote is
refused in a sentence, before anything is written."""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from tests.fakes.model_server import ModelServer, Reply
from tests.golden.record import FALLBACK_KEYS, KILLED_IN_CALL
from tests.test_answers import decisions, run, tool_results
from tests.test_cli import runs_db, tether
from tests.test_sqlite_crash_matrix import check_outcome, model_steps, run_program
from tether._sqlite import SCHEMA_VERSION, Database
from tether.errors import ConfigError
from tether.session import load_session, sqlite_store

GOLDEN = Path(__file__).resolve().parent / "golden"


def goldens(recipe: str) -> list[Path]:
    found = sorted(GOLDEN.glob(f"*-{recipe}.sql"))
    assert found, f"no golden of {recipe} in {GOLDEN}"
    return found


def load(golden: Path, db: Path) -> None:
    db.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(db) as conn:
        conn.executescript(golden.read_text())


def user_version(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
    return int(version)


@pytest.mark.parametrize("golden", goldens("killed-in-an-unsafe-call"), ids=lambda p: p.stem)
def test_a_run_killed_in_an_unsafe_call_resumes(tmp_path: Path, golden: Path) -> None:
    db, effects = tmp_path / "run.db", tmp_path / "effects"
    load(golden, db)
    shutil.copy(golden.with_suffix(".effects"), effects)
    models_before = model_steps(db)
    assert models_before > 0

    resumed = run_program(db, effects)
    assert resumed.returncode == 0, resumed.stderr
    stats = json.loads(resumed.stdout)
    assert sum(stats["replayed"].values()) > 0, stats  # it went on from the golden's journal
    check_outcome(db, effects, stats, models_before)  # no model call or unsafe body twice
    # The body that was cut off after its effect is reported interrupted, not run again.
    session = asyncio.run(load_session(sqlite_store(db), "s"))
    assert session is not None
    [result] = [
        block
        for turn in session.turns
        for block in turn.content
        if block["type"] == "tool_result" and block["tool_use_id"] == KILLED_IN_CALL
    ]
    assert result.get("is_error"), result
    assert user_version(db) == SCHEMA_VERSION


@pytest.mark.parametrize("golden", goldens("parked-for-an-approval"), ids=lambda p: p.stem)
def test_a_run_parked_for_an_approval_resumes_once_answered(tmp_path: Path, golden: Path) -> None:
    shutil.copy(golden.with_suffix(".yaml"), tmp_path / "agent.yaml")
    load(golden, runs_db(tmp_path))

    listed = tether("waiting", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    [line] = listed.stdout.splitlines()
    assert line.startswith('r1  call_0_0  approval  ship({"content":"v1","path":"shipped.txt"})')
    answered = tether("answer", "r1", "--approve", cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run r1: completed" in done.stdout
    assert (tmp_path / "shipped.txt").read_text() == "v1"
    assert tool_results(tmp_path) == ["wrote 2 bytes to shipped.txt"]


@pytest.mark.parametrize("golden", goldens("parked-for-an-answer"), ids=lambda p: p.stem)
def test_a_run_parked_for_an_answer_resumes_with_it(tmp_path: Path, golden: Path) -> None:
    shutil.copy(golden.with_suffix(".yaml"), tmp_path / "agent.yaml")
    load(golden, runs_db(tmp_path))

    answered = tether("answer", "r1", "--value", '"blue"', cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final answer: blue it is" in done.stdout
    assert tool_results(tmp_path) == ["blue"]
    assert decisions(tmp_path) == [
        {"call_id": "call_0_0", "tool": "ask", "kind": "ask_human", "answered": True}
    ]


@pytest.mark.parametrize("golden", goldens("parked-for-more-budget"), ids=lambda p: p.stem)
def test_a_run_parked_for_more_budget_goes_on_once_raised(tmp_path: Path, golden: Path) -> None:
    shutil.copy(golden.with_suffix(".yaml"), tmp_path / "agent.yaml")
    shutil.copy(golden.with_suffix(".txt"), tmp_path / "a.txt")
    load(golden, runs_db(tmp_path))

    [line] = tether("waiting", cwd=tmp_path).stdout.splitlines()
    assert line.startswith("r1  budget:2:0  approval  budget(")
    answered = tether("answer", "r1", "--approve", cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The golden's two calls are replayed, not paid again; two more fit the raised budget.
    assert "run r1: completed after 4 turns and 3 tool calls" in done.stdout
    assert "steps run live: 5 (clock 1, decision 1, model 2, tool 1)" in done.stdout
    assert [(d["tool"], d["approved"]) for d in decisions(tmp_path)] == [("budget", True)]


@pytest.mark.parametrize("golden", goldens("parked-after-a-fallback"), ids=lambda p: p.stem)
def test_a_run_parked_after_a_fallback_goes_on_asking_no_model_again(
    tmp_path: Path, golden: Path, model_server: ModelServer
) -> None:
    document = yaml.safe_load(golden.with_suffix(".yaml").read_text())
    model = document["spec"]["model"]
    model["baseUrl"] = model_server.anthropic_url  # this test's server for the recording's
    model["fallbacks"][0]["baseUrl"] = model_server.openai_url
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(document))
    load(golden, runs_db(tmp_path))
    model_server.script(Reply(text=["shipped"]))

    answered = tether("answer", "r1", "--approve", cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    done = tether("run", "agent.yaml", "--run-id", "r1", cwd=tmp_path, env=FALLBACK_KEYS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run r1: completed" in done.stdout
    assert (tmp_path / "shipped.txt").read_text() == "v1"
    # The first model's failure and the fallback's answer are replayed from the journal; the
    # next turn asks the first model again, and only it.
    assert [r.path.rsplit("/", 1)[-1] for r in model_server.requests] == ["messages"]


@pytest.mark.parametrize("golden", goldens("parked-with-an-output"), ids=lambda p: p.stem)
def test_a_run_parked_with_an_output_ends_with_its_value_counting_the_misses_before(
    tmp_path: Path, golden: Path
) -> None:
    shutil.copy(golden.with_suffix(".yaml"), tmp_path / "agent.yaml")
    load(golden, runs_db(tmp_path))

    answered = tether("answer", "r1", "--approve", cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    done = run(tmp_path, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    stats = json.loads(done.stdout.splitlines()[-1])["stats"]
    assert (stats["status"], stats["output"], stats["turns"]) == ("completed", {"shipped": True}, 4)
    # The golden's three answers are replayed (the two misses, the call that parked); one more
    # is asked, whose value ends the run.
    assert "steps run live: 6 (clock 1, decision 1, model 1, tool 3)" in done.stdout
    assert (tmp_path / "shipped.txt").read_text() == "v1"


@pytest.mark.parametrize(
    "golden", goldens("named-sub-agents-parked-in-parallel"), ids=lambda p: p.stem
)
def test_named_sub_agents_parked_in_parallel_end_with_their_values_once_answered(
    tmp_path: Path, golden: Path
) -> None:
    shutil.copy(golden.with_suffix(".yaml"), tmp_path / "agent.yaml")
    load(golden, runs_db(tmp_path))

    assert tether("answer", "r1", "--approve", cwd=tmp_path).returncode == 0
    done = run(tmp_path, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    stats = json.loads(done.stdout.splitlines()[-1])["stats"]
    assert (stats["status"], stats["text"]) == ("completed", "both")
    outputs = [child["output"] for child in stats["children"]]
    assert outputs == [{"shipped": False}, {"shipped": True}]
    assert tool_results(tmp_path)[-1] == '[child-1] {"shipped":false}\n\n[child-2] {"shipped":true}'
    assert (tmp_path / "shipped.txt").read_text() == "v1"
    # Both children's steps are replayed, each from its own scope; the parked one's value and
    # the parent's answer are asked.
    assert "steps run live: 8 (clock 2, decision 1, model 2, tool 3)" in done.stdout


def test_a_database_a_newer_tether_wrote_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    newer = (
        f"written by a newer Tether (database schema {SCHEMA_VERSION + 1}; this one reads up to "
        f"{SCHEMA_VERSION})"
    )
    with pytest.raises(ConfigError, match=newer.replace("(", r"\(").replace(")", r"\)")):
        Database(db)
    listed = tether("waiting", "--db", str(db), cwd=tmp_path)
    assert listed.returncode == 2
    assert (
        listed.stderr
        == f"tether: {db} was {newer}: upgrade tether to open it, or use another file\n"
    )
    with sqlite3.connect(db) as conn:  # nothing was written to it
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert user_version(db) == SCHEMA_VERSION + 1


def test_a_database_from_before_the_schema_was_stamped_gets_the_stamp(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    load(goldens("parked-for-an-approval")[0], db)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA user_version = 0")  # as every version before the stamp left it
    Database(db).close()
    assert user_version(db) == SCHEMA_VERSION


@pytest.mark.parametrize("golden", goldens("sub-agent-parked-under-a-budget"), ids=lambda p: p.stem)
def test_a_sub_agent_parked_under_a_budget_resumes_once_answered(
    tmp_path: Path, golden: Path
) -> None:
    shutil.copy(golden.with_suffix(".yaml"), tmp_path / "agent.yaml")
    load(golden, runs_db(tmp_path))
    with sqlite3.connect(runs_db(tmp_path)) as conn:
        held = conn.execute("SELECT key, settled FROM tether_budget_calls ORDER BY key").fetchall()

    assert tether("answer", "r1", "--approve", cwd=tmp_path).returncode == 0
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final answer: done" in done.stdout
    assert (tmp_path / "shipped.txt").read_text() == "v1"
    with sqlite3.connect(runs_db(tmp_path)) as conn:
        calls = conn.execute("SELECT key, settled, tokens FROM tether_budget_calls").fetchall()
    # The model calls the golden's ledger held are the same calls, settled once; two more came.
    assert {key for key, _ in held} <= {key for key, _, _ in calls}, (held, calls)
    assert len(calls) == len(held) + 2 and all(settled for _, settled, _ in calls), calls
