"""OpenTelemetry traces of a run on the Restate stack (`tether.testing.AgentHarness`:
restate-server, `tether worker`, its sidecar), exported to a real collector (`tests/otelcol.py`):
a run that fans out to two sub-agents (separate invocations), is SIGKILLed mid-tool and
replayed by a new worker, then parks for an approval and resumes in another invocation, is one
trace with exactly one span per live step, the sub-agents' runs under the spawn call."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.otelcol import Collector, ExportedSpan
from tether.programs.trace_context import span_id_of, trace_id_of
from tether.testing import AgentHarness, wait_until

AgentFactory = Callable[..., AgentHarness]

AGENT = "traced-clerk"
PROMPT = "release 1.4.0"
TASKS = ["check alpha", "check beta"]
SHIP = {"name": "ship", "input": {"path": "shipped.txt", "content": "1.4.0"}}


def child_script(subject: str) -> list[dict[str, Any]]:
    listing = {"name": "list_files", "input": {"path": "."}}
    return [
        {"tool_calls": [listing], "usage": {"input": 40, "output": 8}},
        {"text": f"{subject} ok", "usage": {"input": 50, "output": 3}},
    ]


SCRIPT: dict[str, list[dict[str, Any]]] = {
    PROMPT: [
        {
            "tool_calls": [{"name": "spawn", "input": {"tasks": TASKS, "agent": "checker"}}],
            "usage": {"input": 100, "output": 20},
        },
        {"tool_calls": [{"name": "deploy", "input": {"version": "1.4.0"}}]},
        {"tool_calls": [SHIP]},
        {"text": "released", "usage": {"input": 300, "output": 5}},
    ],
    **{task: child_script(task.split()[1]) for task in TASKS},
}
CHECKER = {"name": "checker", "description": "Checks a part.", "tools": ["list_files"]}
TOOLS = '''\
import asyncio
import os
from pathlib import Path

from tether import tool


@tool
async def deploy(version: str) -> str:
    """Deploy a version (slow, not safe to repeat)."""
    Path(os.environ["TRACE_TEST_MARKERS"], "deploy.started").write_text(version)
    await asyncio.sleep(3600)  # until the test kills the worker
    return f"deployed {version}"
'''


def write_agent(directory: Path) -> Path:
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": AGENT},
        "spec": {
            "model": {"provider": "scripted", "name": "scripted-model", "script": SCRIPT},
            "tools": [
                {"name": "list_files", "builtin": "list_files"},
                {"name": "deploy", "python": "traced_tools:deploy"},
                {"name": "ship", "builtin": "write_file", "requireApproval": True},
            ],
            "subagents": {"maxDepth": 1, "maxConcurrent": 2, "agents": [CHECKER]},
        },
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "traced_tools.py").write_text(TOOLS)
    path = directory / f"{AGENT}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def names(spans: list[ExportedSpan]) -> Counter[str]:
    return Counter(span.name for span in spans)


def hexid(value: int, width: int) -> str:
    return f"{value:0{width}x}"


def test_a_run_with_sub_agents_killed_mid_tool_and_parked_is_one_trace_with_a_span_per_step(
    tether_agent: AgentFactory,
    collector: Collector,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    for variable, value in collector.env().items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("TRACE_TEST_MARKERS", str(markers))
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    agent = tether_agent(write_agent(tmp_path / "manifest"), workspace=tmp_path / "workspace")

    invocation = agent.start_run("s1", PROMPT)
    wait_until(lambda: (markers / "deploy.started").exists(), timeout=120, what="deploy")
    # What ran live before the kill, exported: per child a run, 2 turns, 2 model calls and a
    # tool call; the parent's spawn call, its turn 0 and its model calls of turns 0 and 1.
    first = collector.wait_for(lambda spans: len(spans) == 16, what="the first worker's spans")
    agent.restart_worker()  # SIGKILL mid-deploy; the new worker replays the run

    [call] = agent.parked(at_least=1)  # the replay reported deploy interrupted; ship waits
    assert call["tool"] == "ship"
    agent.approve(call, approver="alice")
    result = agent.result(invocation, timeout=180)
    assert result["status"] == "completed", result

    expected = 25
    collector.wait_for(lambda s: len(s) >= expected, timeout=60, what=f"{expected} spans")
    time.sleep(1.0)  # a span emitted twice would land by now
    spans = collector.spans()
    assert len(spans) == expected, sorted(names(spans).items())
    assert len({span.span_id for span in spans}) == expected
    assert {span.span_id for span in first} <= {span.span_id for span in spans}

    # One trace for the run and its sub-agents, from the run's id.
    [run] = [s for s in spans if not s.parent_id]
    run_id = run.attributes["tether.run.id"]
    assert run.name == f"invoke_agent {AGENT}" and run.span_id == hexid(
        span_id_of(run_id, "run"), 16
    )
    assert {span.trace_id for span in spans} == {hexid(trace_id_of(run_id), 32)}
    assert {span.service for span in spans} == {AGENT}
    assert run.attributes["gen_ai.conversation.id"] == "s1"
    assert run.attributes["tether.run.status"] == "completed"

    mine = [s for s in spans if s.attributes.get("tether.run.id") == run_id]
    assert names(mine) == Counter(
        {
            f"invoke_agent {AGENT}": 1,
            **{f"turn {n}": 1 for n in range(4)},
            "chat scripted-model": 4,
            "execute_tool spawn": 1,
            "execute_tool deploy": 1,
            "execute_tool ship": 1,
            "park ship": 1,
        }
    )
    turns = {s.attributes["tether.turn"]: s for s in mine if s.name.startswith("turn ")}
    tools = {s.attributes["gen_ai.tool.name"]: s for s in mine if s.name.startswith("execute_")}
    for number, tool in enumerate(["spawn", "deploy", "ship"]):
        assert tools[tool].parent_id == turns[number].span_id
    for turn in turns.values():
        assert turn.parent_id == run.span_id
        assert run.start_ns <= turn.start_ns <= turn.end_ns <= run.end_ns
    for chat in (s for s in mine if s.name.startswith("chat ")):
        assert chat.parent_id == turns[chat.attributes["tether.turn"]].span_id
        assert chat.attributes["gen_ai.operation.name"] == "chat"
        assert chat.attributes["gen_ai.system"] == "scripted"
    deploy = tools["deploy"]
    assert deploy.attributes["tether.tool.outcome"] == "interrupted" and deploy.failed
    assert deploy.attributes["tether.tool.replay"] == "unsafe"
    assert tools["spawn"].attributes["tether.tool.outcome"] == "ok"
    assert tools["ship"].attributes["tether.tool.outcome"] == "ok"
    [park] = [s for s in mine if s.name == "park ship"]
    assert park.parent_id == tools["ship"].span_id
    assert park.attributes["tether.park.outcome"] == "approved"
    assert park.attributes["tether.park.approver"] == "alice"

    # Each sub-agent: its own invocation, its run's span under the spawn call.
    children = [s for s in spans if s.parent_id == tools["spawn"].span_id]
    assert len(children) == 2 and {c.name for c in children} == {f"invoke_agent {AGENT}"}
    assert {c.attributes.get("tether.subagent") for c in children} == {"checker"}
    assert "tether.subagent" not in run.attributes  # the session's own run
    for child in children:
        theirs = [
            s
            for s in spans
            if s.attributes.get("tether.run.id") == child.attributes["tether.run.id"]
        ]
        assert names(theirs) == Counter(
            {
                f"invoke_agent {AGENT}": 1,
                "turn 0": 1,
                "turn 1": 1,
                "chat scripted-model": 2,
                "execute_tool list_files": 1,
            }
        )
        assert tools["spawn"].start_ns <= child.start_ns <= child.end_ns <= tools["spawn"].end_ns
