"""Records goldens: what this Tether leaves behind for a later one to go on from. A run stopped
part-way in a user's SQLite file (kept as SQL text: `tests/test_golden_journals.py` resumes it),
and a session's state in Restate, which outlives every version of the worker that wrote it
(`tests/restate/test_golden_sessions.py` runs on it).

    .venv/bin/python -m tests.golden.record [--date YYYY-MM-DD]

A golden is what a released Tether wrote, so one is never edited or recorded again: a change
that cannot go on from it needs a migration (`tether._sqlite.SCHEMA_VERSION`, a reader of the
older state layout) or a replay that still reads its steps. When a shape changes on purpose,
record anew: the new files go beside the old ones (named by the day), and both must keep
working. Each recipe writes `<day>-<recipe>.*`; a recipe with files of the day is left as is.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import signal
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.fakes.model_server import ErrorReply, ModelServer, Reply, ToolCall
from tests.mcp.servers import SuiteFiles, suite_stdio_server
from tests.restate.test_worker import manifest
from tests.test_answers import ASK, SHIP, run, write_agent, write_spender
from tests.test_cli import runs_db, tether
from tests.test_sqlite_crash_matrix import run_program
from tether.parked import INDEX_KEY
from tether.spec import restate_services
from tether.testing import AgentHarness

HERE = Path(__file__).resolve().parent
WRITE = {"name": "write_file", "input": {"path": "notes.txt", "content": "sorted"}}
KILLED_IN_CALL = "call_2_2"
"""The unsafe `notify` of the turn that runs three calls at once (`tests/programs/errands.py`)."""


def killed_in_an_unsafe_call(work: Path, out: Path) -> None:
    """`crash_agent.py` killed inside an unsafe body, after its effect: its intent is journaled,
    its result is not. Beside the dump, the effects the tools had written (`.effects`)."""
    db, effects = work / "run.db", work / "effects"
    effects.touch()
    crashed = run_program(db, effects, "--kill-in-call", KILLED_IN_CALL)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    shutil.copy(effects, out.with_suffix(".effects"))
    dump(db, out.with_suffix(".sql"))


def park(work: Path, out: Path, spec: Path, prompt: str) -> None:
    """`tether run` of `spec` in `work`, which must park (exit 3) for a person; its database
    dumped (`.sql`), the spec beside it (`.yaml`)."""
    parked = run(work, "--prompt", prompt)
    assert parked.returncode == 3, parked.stdout + parked.stderr
    shutil.copy(spec, out.with_suffix(".yaml"))
    dump(runs_db(work), out.with_suffix(".sql"))


def parked_for_an_approval(work: Path, out: Path) -> None:
    """`tether run` of a spec whose tool needs an approval, parked until a person answers."""
    spec = write_agent(work, [{"tool_calls": [SHIP]}, {"text": "shipped"}])
    park(work, out, spec, "ship it")


def parked_for_an_answer(work: Path, out: Path) -> None:
    """`tether run` parked on `ask_human` until a person answers with a value."""
    spec = write_agent(work, [{"tool_calls": [ASK]}, {"text": "blue it is"}])
    park(work, out, spec, "pick a color")


def parked_for_more_budget(work: Path, out: Path) -> None:
    """`tether run` out of its budget after two calls, parked until a person raises it
    (`limits.onExhausted: ask`)."""
    write_spender(work, maxCostUsd=0.25, onExhausted="ask")
    park(work, out, work / "agent.yaml", "spend")
    shutil.copy(work / "a.txt", out.with_suffix(".txt"))


def parked_on_an_mcp_tool(work: Path, out: Path) -> None:
    """`tether run` parked for the approval of an MCP server's tool (the suite's, over stdio),
    after the run's journaled listing of the server's tools. The spec's `mcp.command` is this
    machine's: a test puts its own server there."""
    files = SuiteFiles(work / "suite")
    files.directory.mkdir()
    server = suite_stdio_server(files)
    add = {"tool_calls": [{"name": "add", "input": {"a": 40, "b": 2}}]}
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "mcp-golden"},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": [add, {"text": "42"}]},
            "tools": [
                {
                    "name": "suite",
                    "requireApproval": True,
                    "mcp": {"command": list(server.argv), "include": ["add", "multiply"]},
                }
            ],
        },
    }
    spec = work / "agent.yaml"
    spec.write_text(yaml.safe_dump(document))
    park(work, out, spec, "add 40 and 2")
    assert files.count("add") == 0


SHIPPED = {
    "type": "object",
    "properties": {"shipped": {"type": "boolean"}},
    "required": ["shipped"],
}


def answer(value: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "final_answer", "input": value}]}


def parked_with_an_output(work: Path, out: Path) -> None:
    """`tether run` of an agent with an output (`spec.output`), parked for an approval after
    two answers that missed it: one in text only, one its schema refused."""
    script = [{"text": "shipping"}, answer({"shipped": "yes"}), {"tool_calls": [SHIP]}]
    spec = write_agent(work, [*script, answer({"shipped": True})])
    document = yaml.safe_load(spec.read_text())
    document["spec"]["output"] = {"schema": SHIPPED, "retries": 2}
    spec.write_text(yaml.safe_dump(document))
    park(work, out, spec, "ship it, then say whether it shipped")


SHIPPER = {
    "name": "shipper",
    "description": "Ships one thing and says whether it shipped.",
    "tools": ["ship"],
    "output": {"schema": SHIPPED},
}
PARALLEL_TASKS = {"tasks": ["ship a", "ship b"], "agent": "shipper"}
PARALLEL_SCRIPT = {
    "ship both": [{"tool_calls": [{"name": "spawn", "input": PARALLEL_TASKS}]}, {"text": "both"}],
    "ship a": [answer({"shipped": False})],
    "ship b": [{"tool_calls": [SHIP]}, answer({"shipped": True})],
}


def named_sub_agents_parked_in_parallel(work: Path, out: Path) -> None:
    """`tether run` whose spawn call hands two tasks to a named sub-agent with an output
    (`spec.subagents.agents`), run at once, each child in a journal scope of its own: one
    answers, the other parks for an approval."""
    spec = write_agent(work, [])
    document = yaml.safe_load(spec.read_text())
    document["spec"]["model"]["script"] = PARALLEL_SCRIPT
    document["spec"]["subagents"] = {"maxDepth": 1, "agents": [SHIPPER]}
    spec.write_text(yaml.safe_dump(document))
    park(work, out, spec, "ship both")


FALLBACK_KEYS = {"ANTHROPIC_API_KEY": "golden-a", "OPENAI_API_KEY": "golden-o"}


def parked_after_a_fallback(work: Path, out: Path) -> None:
    """`tether run` whose first model (Anthropic's wire) failed with a 529 and whose fallback
    (OpenAI's) answered with a call that waits for an approval: the failed call, the fallback's
    answer and the models each named in the journal. The spec's base URLs are this recording's
    server: a test puts its own there."""
    spec = write_agent(work, [])
    document = yaml.safe_load(spec.read_text())
    with ModelServer() as model_server:
        model_server.script(
            ErrorReply(529, "Overloaded", "overloaded_error"), Reply(tool_calls=[ToolCall(**SHIP)])
        )
        document["spec"]["model"] = {
            "provider": "anthropic",
            "name": "claude-golden",
            "baseUrl": model_server.anthropic_url,
            "fallbacks": [
                {"provider": "openai", "name": "gpt-golden", "baseUrl": model_server.openai_url}
            ],
        }
        spec.write_text(yaml.safe_dump(document))
        parked = tether(
            "run", "agent.yaml", "--run-id", "r1", "--prompt", "ship it", cwd=work,
            env=FALLBACK_KEYS,
        )  # fmt: skip
        assert parked.returncode == 3, parked.stdout + parked.stderr
        asked = [r.path.rsplit("/", 1)[-1] for r in model_server.requests]
        assert asked == ["messages", "completions"], asked
    shutil.copy(spec, out.with_suffix(".yaml"))
    dump(runs_db(work), out.with_suffix(".sql"))


SPAWN = {"name": "spawn", "input": {"task": "do the ship"}}
SUB_AGENT_SCRIPT = {
    "ship it": [{"tool_calls": [SPAWN]}, {"text": "done"}],
    "do the ship": [{"tool_calls": [SHIP]}, {"text": "child shipped"}],
}


def sub_agent_parked_under_a_budget(work: Path, out: Path) -> None:
    """`tether run` whose sub-agent (the in-process spawn tool) waits for an approval, the run
    under a token budget: the child's steps in the parent's journal, the budget's ledger."""
    spec = write_agent(work, [])
    document = yaml.safe_load(spec.read_text())
    document["spec"]["model"]["script"] = SUB_AGENT_SCRIPT
    document["spec"]["subagents"] = {"maxDepth": 1}
    document["spec"]["limits"] = {"maxTokens": 10_000}
    spec.write_text(yaml.safe_dump(document))
    park(work, out, spec, "ship it")


SESSION_AGENT = "golden-clerk"
SESSION = "s1"
LIST = {"tool_calls": [{"name": "list_files", "input": {}}]}
SESSION_RUNS = [
    ("sort the files", [LIST] * 8 + [{"text": "sorted"}]),
    ("note it", [{"tool_calls": [WRITE]}, {"text": "noted"}]),
]
"""The runs the recorded session holds: 22 turns, so its turns chain has a sealed segment."""
POSTED = "one more thing"
"""A message posted to the session's inbox after its runs, waiting for the next one."""
NEXT_RUN = ("and now?", [{"text": "after the upgrade"}, {"text": "and the one more thing"}])
"""The run the test makes on it: its answer, then (the posted message taken at the answer's
boundary) a follow-up. The scripted model answers by the session's assistant turns."""


def session_manifest() -> dict[str, Any]:
    script = [response for _, responses in [*SESSION_RUNS, NEXT_RUN] for response in responses]
    tools = [
        {"name": "list_files", "builtin": "list_files"},
        {"name": "write_file", "builtin": "write_file"},
    ]
    return manifest(SESSION_AGENT, script, tools=tools)


def restate_session_of_two_runs(work: Path, out: Path) -> None:
    """A session of two runs on `tether worker` (a real restate-server) and a message waiting in
    its inbox: the state of the agent's object and of its inbox's (`.json`), the manifest beside
    it (`.yaml`)."""
    spec = session_manifest()
    services = restate_services(SESSION_AGENT)
    with AgentHarness(spec, workspace=work) as agent:
        for prompt, _ in SESSION_RUNS:
            assert agent.run(SESSION, prompt)["status"] == "completed"
        agent.restate.call(f"{services.inbox}/{SESSION}/post", {"text": POSTED})
        session = agent.session(SESSION)
        assert session is not None
        state = object_states(agent, [(services.agent, SESSION), (services.inbox, SESSION)])
    next_prompt, answers = NEXT_RUN
    expected = {
        "session": SESSION,
        "turns": len(session.turns),
        "runs": len(session.runs),
        "posted": POSTED,
        "next_run": {"prompt": next_prompt, "answer": answers[-1]["text"]},
    }
    write_restate_golden(out, spec, state, expected)


APPROVER = "golden-approver"
APPROVED_WRITE = {"name": "write_file", "input": {"path": "approved.txt", "content": "yes"}}


def restate_parked_for_an_approval(work: Path, out: Path) -> None:
    """A run of `tether worker` parked for a person's approval: the state of the agent's object
    (the run's record) and of its parked calls' index, which the sidecar lists and answers from
    and which outlives every version while the run waits (`.json`); the manifest (`.yaml`)."""
    spec = manifest(
        APPROVER,
        [{"tool_calls": [APPROVED_WRITE]}, {"text": "written"}],
        tools=[{"name": "write_file", "builtin": "write_file", "requireApproval": True}],
    )
    services = restate_services(APPROVER)
    with AgentHarness(spec, workspace=work) as agent:
        agent.start_run(SESSION, "write it")
        [call] = agent.parked(at_least=1)
        state = object_states(agent, [(services.agent, SESSION), (services.parked, INDEX_KEY)])
    expected = {
        "session": SESSION,
        "parked": {k: call[k] for k in ("kind", "tool", "call_id", "input_summary", "session")},
    }
    write_restate_golden(out, spec, state, expected)


SPENDER = "golden-spender"


def restate_parked_for_more_budget(work: Path, out: Path) -> None:
    """A run of `tether worker` out of its budget and parked until a person raises it
    (`limits.onExhausted: ask`), its agent able to spawn, so it reserves from the budget's
    ledger object: the state of the agent's object, of the parked calls' index and of the
    ledger (`<agent>-budget/<root run>`, what `status` reads) (`.json`); the manifest (`.yaml`)."""
    (work / "a.txt").write_text("hi")
    turn = {"tool_calls": [{"name": "read", "input": {"path": "a.txt"}}]}
    usage = {"usage": {"input": 10, "output": 100}}
    script = [{**turn, **usage}] * 3 + [{"text": "done", **usage}]
    spec = manifest(
        SPENDER,
        script,
        tools=[{"name": "read", "builtin": "read_file"}],
        limits={"maxCostUsd": 0.25, "onExhausted": "ask"},
        subagents={"maxDepth": 1},
    )
    spec["spec"]["model"].update(maxTokens=100, pricing={"inputPerMTok": 0, "outputPerMTok": 1000})
    services = restate_services(SPENDER)
    ledger_service = f"{SPENDER}-budget"
    with AgentHarness(spec, workspace=work) as agent:
        agent.start_run(SESSION, "spend")
        [call] = agent.parked(at_least=1)
        [row] = agent.restate.server.query(
            f"SELECT service_key FROM state WHERE service_name = '{ledger_service}'"
        )
        root = row["service_key"]
        state = object_states(
            agent,
            [
                (services.agent, SESSION),
                (services.parked, INDEX_KEY),
                (ledger_service, root),
            ],
        )
        ledger = agent.restate.call(f"{ledger_service}/{root}/status")
    expected = {
        "session": SESSION,
        "parked": {k: call[k] for k in ("kind", "tool", "call_id", "input_summary", "session")},
        "ledger": {"key": root, "status": ledger},
    }
    write_restate_golden(out, spec, state, expected)


def object_states(
    agent: AgentHarness, objects: list[tuple[str, str]]
) -> dict[str, dict[str, dict[str, str]]]:
    """The state of each (service, key) object: each key's value as text (Tether's state is JSON),
    by service and object key."""
    states: dict[str, dict[str, dict[str, str]]] = {}
    for service, key in objects:
        rows = agent.restate.server.query(
            "SELECT key, value_utf8, value_length FROM state "
            f"WHERE service_name = '{service}' AND service_key = '{key}'"
        )
        assert rows, f"{service}/{key} has no state"
        for row in rows:
            assert len(row["value_utf8"].encode()) == row["value_length"], row["key"]
        states.setdefault(service, {})[key] = {row["key"]: row["value_utf8"] for row in rows}
    return states


def write_restate_golden(
    out: Path, spec: dict[str, Any], state: dict[str, Any], expected: dict[str, Any]
) -> None:
    document = {"recorded_at": describe(), "expected": expected, "state": state}
    out.with_suffix(".json").write_text(json.dumps(document, indent=1) + "\n")
    plain = json.loads(json.dumps(spec))  # no shared objects: YAML would write them as anchors
    out.with_suffix(".yaml").write_text(yaml.safe_dump(plain))


RECIPES: dict[str, Callable[[Path, Path], None]] = {
    "killed-in-an-unsafe-call": killed_in_an_unsafe_call,
    "parked-for-an-approval": parked_for_an_approval,
    "parked-for-an-answer": parked_for_an_answer,
    "sub-agent-parked-under-a-budget": sub_agent_parked_under_a_budget,
    "parked-for-more-budget": parked_for_more_budget,
    "parked-on-an-mcp-tool": parked_on_an_mcp_tool,
    "parked-after-a-fallback": parked_after_a_fallback,
    "parked-with-an-output": parked_with_an_output,
    "named-sub-agents-parked-in-parallel": named_sub_agents_parked_in_parallel,
    "restate-session-of-two-runs": restate_session_of_two_runs,
    "restate-parked-for-an-approval": restate_parked_for_an_approval,
    "restate-parked-for-more-budget": restate_parked_for_more_budget,
}


def describe() -> str:
    """The commit the recording's code is at ("-dirty": with changes not yet committed)."""
    return subprocess.run(
        ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=HERE
    ).stdout.strip()


def dump(db: Path, out: Path) -> None:
    with sqlite3.connect(db) as conn:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        lines = list(conn.iterdump())
    header = [
        f"-- recorded by `python -m tests.golden.record` at {describe() or '?'}. Never edit it.",
        f"PRAGMA user_version = {version};",
    ]
    out.write_text("\n".join([*header, *lines]) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    args = parser.parse_args()
    for recipe, make in RECIPES.items():
        out = HERE / f"{args.date}-{recipe}"
        if list(HERE.glob(f"{out.name}.*")):
            print(f"kept {out.name}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp) / "work"
            work.mkdir()
            make(work, out)
        print(f"recorded {out.name}")


if __name__ == "__main__":
    main()
