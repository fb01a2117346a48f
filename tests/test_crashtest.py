"""`tether crashtest`: real processes SIGKILLed at every boundary of a small agent's run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tether.testing import CrashtestError, crash_test

TETHER = [sys.executable, "-m", "tether"]

TOOLS = '''
from pathlib import Path
import os
import time

from tether import tool


@tool
async def charge(amount: int) -> str:
    """Charge a card: not safe to repeat."""
    with Path("charges.log").open("a") as f:
        f.write(f"charged {amount}\\n")
    return f"charged {amount}"


@tool(replay="safe")
async def lookup(item: str) -> str:
    """Read-only."""
    return f"{item}: in stock"


@tool(replay="safe")
async def where() -> str:
    """The working directory, also in a file: each run's own, which crashtest compares as
    <workspace>."""
    Path("where.txt").write_text(os.getcwd())
    return os.getcwd()


@tool(replay="safe")
async def now() -> str:
    """Not the same twice."""
    return str(time.time_ns())
'''

SCRIPT = [
    {
        "text": "Looking.",
        "tool_calls": [{"name": "lookup", "input": {"item": "a"}}, {"name": "where", "input": {}}],
    },
    {"text": "Paying.", "tool_calls": [{"name": "charge", "input": {"amount": 5}}]},
    {"text": "Done."},
]


def agent(tmp_path: Path, script: list[Any] = SCRIPT, **overrides: Any) -> Path:
    (tmp_path / "shop_tools.py").write_text(TOOLS)
    tools = [
        {"name": name, "python": f"shop_tools:{name}", **overrides.get(name, {})}
        for name in ("charge", "lookup", "where", "now")
    ]
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "shop"},
        "spec": {"model": {"provider": "scripted", "name": "s", "script": script}, "tools": tools},
    }
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(document))
    (tmp_path / "workspace").mkdir(exist_ok=True)
    return path


def crashtest(spec: Path, *extra: str, env: dict[str, str] | None = None) -> Any:
    done = subprocess.run(
        [*TETHER, "crashtest", str(spec), "--prompt", "buy a", "--jobs", "2", *extra],
        cwd=spec.parent / "workspace",
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done


def trials(done: subprocess.CompletedProcess[str]) -> dict[str, dict[str, Any]]:
    return {t["kill"]: t for t in json.loads(done.stdout.splitlines()[-1])["trials"]}


def test_every_kill_of_a_correct_agent_passes(tmp_path: Path) -> None:
    done = crashtest(agent(tmp_path), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["status"] == "completed"
    found = trials(done)
    # Every commit of the clean run and every tool call are kill points.
    assert len(found) == report["commits"] + 3 >= 12
    assert all(t["ok"] for t in found.values())
    inside_charge = found["inside charge [call_1_0]"]
    assert inside_charge["notes"][0] == "reported to the model as interrupted: ['call_1_0']"
    assert found["inside lookup [call_0_0]"]["notes"] == [
        "ran again (replay: safe): ['lookup [call_0_0]']"
    ]
    # The user's workspace is copied, never written.
    assert list((tmp_path / "workspace").iterdir()) == []


def test_a_safe_tool_that_is_not_safe_to_repeat_fails(tmp_path: Path) -> None:
    spec = agent(tmp_path, charge={"replay": "safe"})
    done = crashtest(spec, "--json", "--keep", "../runs")  # relative to where it is run
    assert done.returncode == 1, done.stdout + done.stderr
    assert (tmp_path / "runs" / "clean-1" / "runs.db").exists()
    inside = trials(done)["inside charge [call_1_0]"]
    assert not inside["ok"]
    assert inside["problems"] == [
        "files unlike the clean run's: ['charges.log'] after ['charge [call_1_0]'] ran again: "
        "a replay: safe tool must be safe to run twice"
    ]


def test_a_runtime_that_runs_an_unsafe_call_again_fails(tmp_path: Path) -> None:
    """Without the intent an unsafe call journals before its body, a crash inside it runs it
    again: crashtest says so (a runtime broken on purpose, through sitecustomize)."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(
        "from tether.agent.tool_calls import ToolCallExecutor\n"
        "ToolCallExecutor._needs_intent = lambda self, call: False\n"
    )
    env = dict(os.environ, PYTHONPATH=str(broken))
    done = crashtest(agent(tmp_path), "--json", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    inside = trials(done)["inside charge [call_1_0]"]
    assert "charge [call_1_0] (replay: unsafe) ran 2 times" in inside["problems"]


def test_a_result_lost_by_the_journal_fails(tmp_path: Path) -> None:
    """A journal that loses `charge`'s result when it is read again (a runtime broken on
    purpose): the resumed run reports the call as interrupted though its result was journaled
    before the kill, and crashtest says it was lost."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(
        "import sqlite3\n"
        "from tether.durable import sqlite\n"
        "load, record = sqlite.SqliteJournal.__init__, sqlite.SqliteJournal.record\n"
        "def lossy(self, *args):\n"
        "    load(self, *args)\n"
        "    for key, entry in list(self._entries.items()):\n"
        "        if entry.name == 'tool:call_1_0':\n"
        "            del self._entries[key]\n"
        "def again(self, scope, seq, entry):\n"
        "    try:\n"
        "        record(self, scope, seq, entry)\n"
        "    except sqlite3.IntegrityError:\n"
        "        self._entries[(scope, seq)] = entry\n"
        "sqlite.SqliteJournal.__init__, sqlite.SqliteJournal.record = lossy, again\n"
    )
    env = dict(os.environ, PYTHONPATH=str(broken))
    done = crashtest(agent(tmp_path), "--json", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [t for t in trials(done).values() if not t["ok"]]
    assert failed and all(
        t["problems"]
        == [
            "reported as interrupted though their results were journaled before the kill "
            "(lost): ['call_1_0']"
        ]
        for t in failed
    ), failed
    assert all(t["kill"].startswith("after commit ") for t in failed)


def test_an_agent_that_is_not_deterministic_is_refused(tmp_path: Path) -> None:
    script = [{"tool_calls": [{"name": "now", "input": {}}]}, {"text": "Done."}]
    done = crashtest(agent(tmp_path, script))
    assert done.returncode == 2
    assert "two runs without a crash differ (turn 3 (user) differs" in done.stderr
    assert "the agent must be deterministic" in done.stderr


def test_a_real_model_without_a_script_is_refused(tmp_path: Path) -> None:
    spec = agent(tmp_path)
    document = yaml.safe_load(spec.read_text())
    document["spec"]["model"] = {"provider": "anthropic", "name": "claude-sonnet-4-5"}
    spec.write_text(yaml.safe_dump(document))
    env = dict(os.environ, ANTHROPIC_API_KEY="sk-never-used")
    done = crashtest(spec, env=env)
    assert done.returncode == 2
    assert "crashtest runs the agent against a scripted model" in done.stderr
    assert "pass one (--script)" in done.stderr


def test_what_cannot_work_is_refused_before_any_run(tmp_path: Path) -> None:
    spec = agent(tmp_path)
    document = yaml.safe_load(spec.read_text())
    real = {"provider": "openai", "name": "gpt-4o"}
    document["spec"]["model"]["fallbacks"] = [real]
    spec.write_text(yaml.safe_dump(document))
    with pytest.raises(CrashtestError, match=r"has spec.model.fallbacks\[0\] \(openai/gpt-4o\)"):
        crash_test(spec, "buy a", workspace=tmp_path / "workspace")
    with pytest.raises(CrashtestError, match="is inside the workspace"):
        crash_test(spec, "buy a", workspace=tmp_path, keep=tmp_path / "runs")
    with pytest.raises(CrashtestError, match="is not a directory"):
        crash_test(spec, "buy a", workspace=tmp_path / "nowhere")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "agent.yaml",
        "shop_tools.py",
        "workspace",
    ]


def asking_agent(tmp_path: Path) -> Path:
    """Asks a person, then waits for approval of an unsafe call."""
    script = [
        {"tool_calls": [{"name": "ask", "input": {"question": "How much?"}}]},
        {"text": "Paying.", "tool_calls": [{"name": "charge", "input": {"amount": 5}}]},
        {"text": "Done."},
    ]
    spec = agent(tmp_path, script, charge={"requireApproval": True})
    document = yaml.safe_load(spec.read_text())
    document["spec"]["tools"].append({"name": "ask", "builtin": "ask_human"})
    spec.write_text(yaml.safe_dump(document))
    return spec


def test_kills_around_a_persons_answers_pass(tmp_path: Path) -> None:
    """Killed before and after each answer is recorded and inside the approved call's body."""
    spec = asking_agent(tmp_path)
    parked = crashtest(spec, "--json", "--max-kills", "4")
    assert parked.returncode == 0, parked.stdout + parked.stderr
    assert json.loads(parked.stdout.splitlines()[-1])["status"] == "parked"

    done = crashtest(spec, "--json", "--approve", "--human-answer", '"5"')
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["status"] == "completed"
    found = trials(done)
    answers = [kill for kill in found if ", before the answer to " in kill]
    assert [kill.split(", before ")[1] for kill in answers] == [
        "the answer to ask [call_0_0]",
        "the answer to charge [call_1_0]",
    ]
    # The approved body is counted (its hooks fire on replays too: it is wrapped).
    assert found["inside charge [call_1_0]"]["notes"] == [
        "reported to the model as interrupted: ['call_1_0']"
    ]


def test_a_sub_agents_calls_are_killed_in_too(tmp_path: Path) -> None:
    """Through the Python API: a sub-agent's unsafe call, of the same call id as its parent's
    spawn, is killed in and counted apart."""
    spawn = {"task": "pay", "agent": "payer"}
    script = {
        "buy a": [{"tool_calls": [{"name": "spawn", "input": spawn}]}, {"text": "bought"}],
        "pay": [{"tool_calls": [{"name": "charge", "input": {"amount": 7}}]}, {"text": "paid"}],
    }
    spec = agent(tmp_path)
    document = yaml.safe_load(spec.read_text())
    document["spec"]["model"]["script"] = script
    payer = {"name": "payer", "description": "Pays.", "tools": ["charge"]}
    document["spec"]["subagents"] = {"maxDepth": 1, "agents": [payer]}
    spec.write_text(yaml.safe_dump(document))
    report = crash_test(spec, "buy a", workspace=tmp_path / "workspace", jobs=2)
    assert report.status == "completed"
    assert not report.failed, report.describe()
    [inside] = [t for t in report.trials if t.kill == "inside charge [call_0_0]"]
    assert inside.notes == ["reported to the model as interrupted: ['call_0_0']"]
    # Both processes' model calls: the parent's two and the child's two, none made again.
    assert report.model_calls == 4


AGAIN = ", then after the next step"


def test_a_second_kill_finds_a_recovery_that_one_kill_does_not(tmp_path: Path) -> None:
    """A journal whose steps after a resume never reach the file (a runtime broken on
    purpose): one kill passes everywhere, since the recovery keeps them in memory to its end;
    `--twice` kills the recovery after its first step, and the run resumed from the file runs
    its calls again."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(
        "from tether.durable import sqlite\n"
        "load, record = sqlite.SqliteJournal.__init__, sqlite.SqliteJournal.record\n"
        "def resumed(self, db, run_id):\n"
        "    load(self, db, run_id)\n"
        "    self.resumed = len(self._entries) > 0\n"
        "def elsewhere(self, scope, seq, entry):\n"
        "    run_id = self._run_id\n"
        "    if self.resumed:\n"
        "        self._run_id = run_id + '/lost'\n"
        "    try:\n"
        "        record(self, scope, seq, entry)\n"
        "    finally:\n"
        "        self._run_id = run_id\n"
        "sqlite.SqliteJournal.__init__, sqlite.SqliteJournal.record = resumed, elsewhere\n"
    )
    env = dict(os.environ, PYTHONPATH=str(broken))
    done = crashtest(agent(tmp_path), "--twice", "--max-kills", "5", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    # Each trial is said as it ends, the failed ones named again at the end.
    said = done.stdout.splitlines()
    assert sum(line.startswith("  [") for line in said) == 16
    assert "16 kills: " in done.stdout
    failed = [line.split(": ", 1)[1] for line in said if line.startswith("  FAILED: ")]
    assert failed and all(kill.endswith(AGAIN) for kill in failed), done.stdout
    assert "lookup [call_0_0] ran again though its result was journaled before" in done.stdout


def test_a_correct_agent_survives_a_second_kill(tmp_path: Path) -> None:
    """Its approved call too, which a recovery journals as interrupted before it says so."""
    report = crash_test(
        asking_agent(tmp_path),
        "buy a",
        workspace=tmp_path / "workspace",
        approve=True,
        human_answer="5",
        max_kills=6,
        twice=True,
    )
    assert not report.failed, report.describe()
    found = {trial.kill: trial for trial in report.trials}
    assert len(found) == 2 * (6 + 1)
    # Killed inside `charge`, then after its recovery journaled the call as interrupted.
    assert found[f"inside charge [call_1_0]{AGAIN}"].notes == [
        "reported to the model as interrupted: ['call_1_0']"
    ]
    # After the answer nothing is left to journal.
    last = f"after commit {report.commits}{AGAIN}"
    assert found[last].notes == ["no step journaled after the kill: killed once"]
