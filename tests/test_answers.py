"""Calls that wait for a person on the embedded runtime: `tether run` stops (exit 3) at an
approval or `ask_human`, `tether answer` records the answer, the same `tether run` resumes from
the journal. Real processes, a real SQLite file."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
import yaml

from tests.test_cli import runs_db, tether
from tests.test_cli import tool_results as cli_tool_results
from tether.session import load_session, sqlite_store

SHIP = {"name": "ship", "input": {"path": "shipped.txt", "content": "v1"}}
ASK = {"name": "ask", "input": {"question": "Which color?"}}


def write_agent(directory: Path, script: list[dict[str, Any]], **approvals: str) -> Path:
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "shipper"},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": script},
            "tools": [
                {"name": "ship", "builtin": "write_file", "requireApproval": True},
                {"name": "ask", "builtin": "ask_human"},
            ],
            "approvals": approvals,
        },
    }
    path = directory / "agent.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def run(directory: Path, *extra: str) -> Any:
    return tether("run", "agent.yaml", "--run-id", "r1", *extra, cwd=directory)


def tool_results(directory: Path) -> list[str]:
    return cli_tool_results(runs_db(directory), "r1")


def decisions(directory: Path) -> list[dict[str, Any]]:
    """The people's decisions in the run's record in the session (the audit trail)."""

    async def read() -> list[dict[str, Any]]:
        session = await load_session(sqlite_store(runs_db(directory)), "r1")
        assert session is not None
        [record] = session.runs
        return record.decisions

    return asyncio.run(read())


def run_status(directory: Path) -> str:
    with sqlite3.connect(runs_db(directory)) as db:
        [(status,)] = db.execute("SELECT status FROM tether_runs WHERE run_id = 'r1'").fetchall()
    return str(status)


def test_an_approval_parks_the_run_until_it_is_answered(tmp_path: Path) -> None:
    write_agent(tmp_path, [{"tool_calls": [SHIP]}, {"text": "shipped"}])
    parked = run(tmp_path, "--prompt", "ship it")
    assert parked.returncode == 3, parked.stdout + parked.stderr
    assert "run r1: parked, waiting for a person" in parked.stdout
    assert 'approval: ship({"content":"v1","path":"shipped.txt"})  [call_0_0]' in parked.stdout
    assert not (tmp_path / "shipped.txt").exists()
    assert run_status(tmp_path) == "parked"
    listed = tether("waiting", cwd=tmp_path)
    assert listed.returncode == 0
    [line] = listed.stdout.splitlines()
    assert line.startswith('r1  call_0_0  approval  ship({"content":"v1","path":"shipped.txt"})')
    # Resuming without an answer parks again, and runs nothing.
    again = run(tmp_path)
    assert again.returncode == 3 and not (tmp_path / "shipped.txt").exists()

    answered = tether("answer", "r1", "--approve", "--approver", "alice", cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    assert "answered ship [call_0_0] of run r1" in answered.stdout
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run r1: completed" in done.stdout
    assert (tmp_path / "shipped.txt").read_text() == "v1"
    assert tool_results(tmp_path) == ["wrote 2 bytes to shipped.txt"]
    assert run_status(tmp_path) == "completed"
    approved_by_alice = {
        "call_id": "call_0_0",
        "tool": "ship",
        "kind": "approval",
        "approved": True,
        "by": "cli",
        "approver": "alice",
        "decided_at": ANY,
    }
    assert decisions(tmp_path) == [approved_by_alice]
    # The answer is in the journal: nothing waits any more, and a replay decides the same.
    assert tether("waiting", cwd=tmp_path).stdout == ""
    late = tether("answer", "r1", "--deny", cwd=tmp_path)
    assert late.returncode == 2 and "nothing waits for an answer in run 'r1'" in late.stderr
    (tmp_path / "shipped.txt").unlink()
    replayed = run(tmp_path)
    assert replayed.returncode == 0 and not (tmp_path / "shipped.txt").exists()
    assert decisions(tmp_path) == [approved_by_alice]  # recorded once, however often replayed


def test_a_denial_reaches_the_model_and_nothing_runs(tmp_path: Path) -> None:
    write_agent(tmp_path, [{"tool_calls": [SHIP]}, {"text": "not shipped"}])
    assert run(tmp_path, "--prompt", "ship it").returncode == 3
    denied = tether("answer", "r1", "--deny", "--reason", "freeze week", cwd=tmp_path)
    assert denied.returncode == 0, denied.stderr
    assert run(tmp_path).returncode == 0
    assert not (tmp_path / "shipped.txt").exists()
    assert tool_results(tmp_path) == ["Tool error: Denied: freeze week. The call was not run."]
    [decision] = decisions(tmp_path)
    assert decision == {
        "call_id": "call_0_0",
        "tool": "ship",
        "kind": "approval",
        "approved": False,
        "by": "cli",
        "decided_at": ANY,
    }


def test_ask_human_returns_the_answer(tmp_path: Path) -> None:
    write_agent(tmp_path, [{"tool_calls": [ASK]}, {"text": "blue it is"}])
    parked = run(tmp_path, "--prompt", "pick a color")
    assert parked.returncode == 3
    assert 'ask_human: ask({"question":"Which color?"})  [call_0_0]' in parked.stdout
    assert tether("answer", "r1", "--value", '"blue"', cwd=tmp_path).returncode == 0
    assert run(tmp_path).returncode == 0
    assert tool_results(tmp_path) == ["blue"]
    assert decisions(tmp_path) == [
        {"call_id": "call_0_0", "tool": "ask", "kind": "ask_human", "answered": True}
    ]


@pytest.mark.parametrize(
    ("policy", "result"),
    [
        ("approve", "wrote 2 bytes to shipped.txt"),
        ("deny", "Tool error: Denied: no decision in time. The call was not run."),
    ],
)
def test_the_deadline_applies_when_the_run_resumes(
    tmp_path: Path, policy: str, result: str
) -> None:
    write_agent(tmp_path, [{"tool_calls": [SHIP]}, {"text": "ok"}], timeout="1h", onTimeout=policy)
    assert run(tmp_path, "--prompt", "ship it").returncode == 3
    # Two hours pass (the deadline counts from the first park).
    with sqlite3.connect(runs_db(tmp_path)) as db:
        db.execute("UPDATE tether_answers SET parked_at = parked_at - 7200")
    resumed = run(tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert tool_results(tmp_path) == [result]
    assert (tmp_path / "shipped.txt").exists() == (policy == "approve")
    [decision] = decisions(tmp_path)
    assert decision == {
        "call_id": "call_0_0",
        "tool": "ship",
        "kind": "approval",
        "approved": policy == "approve",
        "timed_out": True,
    }


def test_answer_errors_are_clear(tmp_path: Path) -> None:
    write_agent(tmp_path, [{"tool_calls": [SHIP]}, {"text": "ok"}])
    missing = tether("answer", "r1", "--approve", cwd=tmp_path)
    assert missing.returncode == 2 and f"{runs_db(tmp_path)} does not exist" in missing.stderr
    assert run(tmp_path, "--prompt", "ship it").returncode == 3
    unknown = tether("answer", "r9", "--approve", cwd=tmp_path)
    assert unknown.returncode == 2 and "nothing waits for an answer in run 'r9'" in unknown.stderr
    wrong_call = tether("answer", "r1", "--approve", "--call", "call_7_0", cwd=tmp_path)
    assert wrong_call.returncode == 2 and "call 'call_7_0' of run 'r1'" in wrong_call.stderr
    not_json = tether("answer", "r1", "--value", "blue", cwd=tmp_path)
    assert not_json.returncode == 2 and "--value is not JSON" in not_json.stderr
    both = tether("answer", "r1", "--approve", "--deny", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr
    assert "Traceback" not in missing.stderr + unknown.stderr + wrong_call.stderr


def test_a_sub_agent_parks_the_run_and_resumes_with_it(tmp_path: Path) -> None:
    """`spec.subagents` gives `tether run` the in-process spawn tool; a child's approval stops
    the whole run, and the resumed run replays parent and child up to it."""
    spawn = {"name": "spawn", "input": {"task": "do the ship"}}
    script = {
        "ship it": [{"tool_calls": [spawn]}, {"text": "done"}],
        "do the ship": [{"tool_calls": [SHIP]}, {"text": "child shipped"}],
    }
    path = write_agent(tmp_path, [])
    document = yaml.safe_load(path.read_text())
    document["spec"]["model"]["script"] = script
    document["spec"]["subagents"] = {"maxDepth": 1}
    path.write_text(yaml.safe_dump(document))
    parked = run(tmp_path, "--prompt", "ship it")
    assert parked.returncode == 3, parked.stdout + parked.stderr
    assert "approval: ship(" in parked.stdout and not (tmp_path / "shipped.txt").exists()
    assert tether("answer", "r1", "--approve", cwd=tmp_path).returncode == 0
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "final answer: done" in done.stdout
    assert (tmp_path / "shipped.txt").read_text() == "v1"
    # Replaying the finished run decides the same and runs nothing again.
    (tmp_path / "shipped.txt").unlink()
    assert run(tmp_path).returncode == 0 and not (tmp_path / "shipped.txt").exists()


def test_spawn_is_the_sub_agent_tool(tmp_path: Path) -> None:
    path = write_agent(tmp_path, [{"text": "ok"}])
    document = yaml.safe_load(path.read_text())
    document["spec"]["subagents"] = {"maxDepth": 1}
    document["spec"]["tools"].append({"name": "spawn", "builtin": "read_file"})
    path.write_text(yaml.safe_dump(document))
    refused = run(tmp_path, "--prompt", "go")
    assert refused.returncode == 2
    assert "'spawn' is the sub-agent tool of `spec.subagents`" in refused.stderr
    with sqlite3.connect(runs_db(tmp_path)) as db:  # the run was never opened
        assert db.execute("SELECT * FROM tether_runs").fetchall() == []


def write_spender(directory: Path, **limits: Any) -> None:
    """An agent whose calls cost $0.10 each at most and do: 3 tool turns and an answer."""
    turn = {"tool_calls": [{"name": "read", "input": {"path": "a.txt"}}]}
    usage = {"usage": {"input": 10, "output": 100}}
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "spender"},
        "spec": {
            "model": {
                "provider": "scripted",
                "name": "s",
                "maxTokens": 100,
                "pricing": {"inputPerMTok": 0, "outputPerMTok": 1000},
                "script": [{**turn, **usage}] * 3 + [{"text": "done", **usage}],
            },
            "tools": [{"name": "read", "builtin": "read_file"}],
            "limits": limits,
        },
    }
    (directory / "agent.yaml").write_text(yaml.safe_dump(document))
    (directory / "a.txt").write_text("hi")


def budget_limits(directory: Path) -> dict[str, Any]:
    with sqlite3.connect(runs_db(directory)) as db:
        [(limits,)] = db.execute("SELECT limits FROM tether_budgets").fetchall()
    return dict(json.loads(limits))


def test_an_exhausted_budget_parks_the_run_until_a_person_raises_it(tmp_path: Path) -> None:
    write_spender(tmp_path, maxCostUsd=0.25, onExhausted="ask")
    parked = run(tmp_path, "--prompt", "spend")
    assert parked.returncode == 3, parked.stdout + parked.stderr
    asked = (
        'approval: budget({"spent":{"cost_usd":0.2},"budget":{"cost_usd":0.25},'
        '"next_call_at_most":{"cost_usd":0.1},"raise_to":{"cost_usd":0.5}})  [budget:2:0]'
    )
    assert asked in parked.stdout
    assert "[turn 3]" not in parked.stdout  # the third call did not start
    [line] = tether("waiting", cwd=tmp_path).stdout.splitlines()
    assert line.startswith("r1  budget:2:0  approval  budget(")
    answered = tether("answer", "r1", "--approve", "--approver", "bob", cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    done = run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The two calls before the park are replayed, never paid again; two more fit in $0.50.
    assert "run r1: completed after 4 turns and 3 tool calls" in done.stdout
    assert "$0.4000" in done.stdout and "final answer: done" in done.stdout
    assert "steps run live: 5 (clock 1, decision 1, model 2, tool 1)" in done.stdout
    assert budget_limits(tmp_path)["cost_usd"] == 0.5
    raised = {
        "call_id": "budget:2:0",
        "tool": "budget",
        "kind": "approval",
        "approved": True,
        "by": "cli",
        "approver": "bob",
        "decided_at": ANY,
    }
    assert decisions(tmp_path) == [raised]
    replayed = run(tmp_path)  # the answer is journaled: the same path, recorded once
    assert replayed.returncode == 0 and "steps run live: 0" in replayed.stdout
    assert decisions(tmp_path) == [raised] and budget_limits(tmp_path)["cost_usd"] == 0.5


def test_a_denied_raise_stops_the_run_on_its_budget(tmp_path: Path) -> None:
    write_spender(tmp_path, maxCostUsd=0.25, onExhausted="ask")
    assert run(tmp_path, "--prompt", "spend").returncode == 3
    assert tether("answer", "r1", "--deny", cwd=tmp_path).returncode == 0
    stopped = run(tmp_path)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "run r1: budget_exceeded after 2 turns" in stopped.stdout
    assert budget_limits(tmp_path)["cost_usd"] == 0.25
    assert [d["approved"] for d in decisions(tmp_path)] == [False]


def test_without_ask_an_exhausted_budget_stops_the_run(tmp_path: Path) -> None:
    write_spender(tmp_path, maxCostUsd=0.25)
    stopped = run(tmp_path, "--prompt", "spend")
    assert stopped.returncode == 1 and "run r1: budget_exceeded after 2 turns" in stopped.stdout
    assert tether("waiting", cwd=tmp_path).stdout == ""


def test_an_approval_may_name_the_budget_it_grants(tmp_path: Path) -> None:
    write_spender(tmp_path, maxCostUsd=0.25, onExhausted="ask")
    assert run(tmp_path, "--prompt", "spend").returncode == 3
    value = '{"approved": true, "raise_to": {"cost_usd": 0.35}}'
    assert tether("answer", "r1", "--value", value, cwd=tmp_path).returncode == 0
    # $0.35 lets one more call start, not two: the run asks again before its fourth.
    parked = run(tmp_path)
    assert parked.returncode == 3, parked.stdout + parked.stderr
    assert '"budget":{"cost_usd":0.35}' in parked.stdout and "[budget:3:0]" in parked.stdout
    assert budget_limits(tmp_path)["cost_usd"] == 0.35
