"""`tether run` with a stdio MCP server: an approval on one of its tools parks the run, the
answer resumes it, and the server's tools are called once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.mcp.servers import StdioServer, SuiteFiles
from tests.test_answers import tool_results
from tests.test_cli import runs_db, tether
from tests.test_golden_journals import goldens, load


def write_agent(directory: Path, suite: StdioServer, clock: StdioServer) -> None:
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "add", "input": {"a": 40, "b": 2}}]},
        {
            "tool_calls": [
                {
                    "name": "clock_convert_time",
                    "input": {
                        "source_timezone": "UTC",
                        "time": "08:30",
                        "target_timezone": "Europe/Paris",
                    },
                }
            ]
        },
        {"text": "42, and 8:30 UTC is 9:30 or 10:30 in Paris"},
    ]
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "mcp-cli"},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": script},
            "tools": [
                {
                    "name": "suite",
                    "requireApproval": True,
                    "mcp": {"command": list(suite.argv), "include": ["add"]},
                },
                {
                    "name": "time",
                    "mcp": {"command": list(clock.argv), "prefix": "clock_"},
                },
            ],
        },
    }
    (directory / "agent.yaml").write_text(yaml.safe_dump(document))


def test_tether_run_parks_an_mcp_call_for_approval_and_resumes(
    tmp_path: Path,
    suite_server_stdio: StdioServer,
    suite_files: SuiteFiles,
    time_server_stdio: StdioServer,
) -> None:
    write_agent(tmp_path, suite_server_stdio, time_server_stdio)

    parked = tether("run", "agent.yaml", "--run-id", "r1", "--prompt", "go", cwd=tmp_path)
    assert parked.returncode == 3, parked.stdout + parked.stderr
    assert 'approval: add({"a":40,"b":2})' in parked.stdout
    assert suite_files.count("add") == 0

    answered = tether("answer", "r1", "--approve", cwd=tmp_path)
    assert answered.returncode == 0, answered.stderr
    done = tether("run", "agent.yaml", "--run-id", "r1", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    added, converted = tool_results(tmp_path)
    assert added == "42"
    target = json.loads(converted)["target"]
    assert target["timezone"] == "Europe/Paris"
    assert target["datetime"].endswith(("T09:30:00+01:00", "T10:30:00+02:00"))
    assert suite_files.count("add") == 1


@pytest.mark.parametrize("golden", goldens("parked-on-an-mcp-tool"), ids=lambda p: p.stem)
def test_a_run_an_earlier_tether_parked_on_an_mcp_tool_resumes(
    tmp_path: Path, golden: Path, suite_server_stdio: StdioServer, suite_files: SuiteFiles
) -> None:
    """The golden's journal holds the run's listing of the server's tools and the parked call;
    this Tether resumes it against today's server process (its command is this machine's)."""
    document = yaml.safe_load(golden.with_suffix(".yaml").read_text())
    document["spec"]["tools"][0]["mcp"]["command"] = list(suite_server_stdio.argv)
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(document))
    load(golden, runs_db(tmp_path))

    [line] = tether("waiting", cwd=tmp_path).stdout.splitlines()
    assert line.startswith('r1  call_0_0  approval  add({"a":40,"b":2})'), line
    assert tether("answer", "r1", "--approve", cwd=tmp_path).returncode == 0
    done = tether("run", "agent.yaml", "--run-id", "r1", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert tool_results(tmp_path) == ["42"] and "final answer: 42" in done.stdout
    [call] = suite_files.calls("add")
    assert len(call["idempotency_key"]) == 32
