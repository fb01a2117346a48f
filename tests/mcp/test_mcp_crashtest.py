"""`tether crashtest` on an agent whose tools are a real MCP server's, one call gated."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.mcp.servers import StdioServer, SuiteFiles
from tether.testing import crash_test


def test_calls_of_an_mcp_server_are_counted_and_killed_in_behind_an_approval(
    tmp_path: Path, suite_server_stdio: StdioServer, suite_files: SuiteFiles
) -> None:
    suite_files.release()  # its slow tools answer at once
    script = [
        {"tool_calls": [{"name": "add", "input": {"a": 1, "b": 2}}]},
        {"tool_calls": [{"name": "slow_write", "input": {"key": "k"}}]},
        {"text": "Done."},
    ]
    mcp = {
        "command": list(suite_server_stdio.argv),
        "include": ["add", "slow_write"],
        "tools": {"slow_write": {"requireApproval": True}},
        "sandbox": {"enabled": False},  # it writes its calls' log outside the workspace
    }
    document = {
        "apiVersion": "tether.dev/v1alpha1",
        "kind": "DurableAgent",
        "metadata": {"name": "suite"},
        "spec": {
            "model": {"provider": "scripted", "name": "s", "script": script},
            "tools": [{"name": "suite", "mcp": mcp}],
        },
    }
    spec = tmp_path / "agent.yaml"
    spec.write_text(yaml.safe_dump(document))
    (tmp_path / "workspace").mkdir()
    report = crash_test(
        spec, "go", workspace=tmp_path / "workspace", approve=True, max_kills=2, jobs=2
    )
    assert report.status == "completed"
    assert not report.failed, report.describe()
    trials = {trial.kill: trial for trial in report.trials}
    # The gated body, behind its approval, is counted once and killed in: reported interrupted.
    assert trials["inside slow_write [call_1_0]"].notes == [
        "reported to the model as interrupted: ['call_1_0']"
    ]
    assert trials["inside add [call_0_0]"].notes == ["ran again (replay: safe): ['add [call_0_0]']"]
    calls = [json.loads(line)["tool"] for line in suite_files.calls_log.read_text().splitlines()]
    # Two clean runs, then one body a kill point (add: once more inside its own call).
    assert calls.count("slow_write") == 2 + len(report.trials)
